"""Engineering diagnostics of QH fits: observed commissioning gates and memory guards.

Owns: opt-in commissioning that observes successful optimizer updates, saves CPU
state at declared gates and authenticates it later. ``commissioning`` is the seed module and
re-exports every name from the modules that implement them: ``milestones`` (config, receipt,
file names, reader), ``milestone_gate`` (the Lightning callback on a live fit) and
``mps_memory`` (the live MPS tensor-allocation guard and its observation). Does not own: the
fit composition (``qhlab.finite_horizon.fit``), the ``qhlab commission`` run
(``qhlab.finite_horizon.commission``), learning quality or the final fit receipt.
The package itself exports nothing: import the names from ``commissioning``, so that importing
the package imports neither torch nor Lightning.
"""

__all__: list[str] = []
