"""An environment tried before a population is drawn from it: ``qhlab env check PRESET``.

Owns: ``check_environment``, which makes a preset's environment, runs the contract checks and the
determinism probes of generation on a few scenes (``probes.check_contract``: two steps deep,
again in another order, and in a fresh interpreter for an environment qhlab does not pin), times its
step, and draws a small population in a temporary directory to print its difficulty card and the
reward-scale settings it suggests, then removes it. Does not own: the checks themselves
(``environment``), generation (``population``) or the card (``difficulty``).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from qhlab.evidence import input_error
from qhlab.scenes.contract import OPTIONAL_MEMBERS
from qhlab.scenes.describe import describe_population
from qhlab.scenes.environment import Environment
from qhlab.scenes.population import environment_spec, generate_population
from qhlab.scenes.presets import load_preset
from qhlab.scenes.probes import check_contract
from qhlab.scenes.sampler import scene_seed

__all__ = ["check_environment"]

# Scenes a check may draw: enough for a card to say something, few enough to stay a check.
_MAX_SCENES = 200


def check_environment(preset: str | os.PathLike, *, scenes: int = 8, call: str = "qhlab env check") -> dict[str, Any]:
    """Try a preset's environment without publishing anything.

    Args:
        preset: a built-in preset's name or a preset file.
        scenes: scenes to probe and to draw the card from (1..200; the preset's own count is not used).
        call: the command named in refusals.

    Returns:
        ``{"environment": its name, "identity", "reward_unit", "contract": {"scenes", "steps",
        "fresh_process", "rollout_steps"}, "starts": {"drawn", "distinct", "preset_scenes"}: how many
        of the preset's first scenes (up to 200) start in a state of their own, "optional":
        {"declared", "defaults"}: which of ``OPTIONAL_MEMBERS`` the
        environment has and which take qhlab's default, "step_seconds": {"median", "max", "steps"},
        "card": the difficulty card of ``scenes`` scenes (split train, seed 0), "suggested":
        ``difficulty.suggested_settings``, "described": what ``describe_population`` returned (for ``card_lines``)}``.

    Raises:
        QhInputError: a bad preset or ``scenes``, or an environment that breaks its contract or
            steps differently for the same inputs (one line naming the method and the cause).
    """
    if isinstance(scenes, bool) or not isinstance(scenes, int) or not 1 <= scenes <= _MAX_SCENES:
        raise input_error(call, "--scenes", scenes, f"an integer in 1..{_MAX_SCENES}", "8 scenes take seconds")
    spec = load_preset(preset, call=call)
    environment = Environment.make(environment_spec(spec, call=call), call=call)
    seeds = tuple(scene_seed("train", 0, i) for i in range(scenes))
    contract = check_contract(environment, seeds[: min(scenes, 3)])
    # Distinct starts over as many scenes as the preset draws (up to the card's bound): a task that
    # starts the same everywhere gives a validation that repeats TRAIN (the study refuses it).
    drawn = min(spec.scenes, _MAX_SCENES)
    starts = set()
    for index in range(drawn):
        scene = json.loads(json.dumps(environment.sample_scene(scene_seed("train", 0, index)), allow_nan=False))
        starts.add(environment.initial_state(scene).tobytes())
    timings = []
    for seed in seeds:
        scene = json.loads(json.dumps(environment.sample_scene(seed), allow_nan=False))
        state = environment.initial_state(scene)
        for action in range(environment.candidates(scene, state)):
            started = time.perf_counter()
            environment.step(scene, state, action)
            timings.append(time.perf_counter() - started)
    small = spec.model_copy(update={"scenes": scenes})
    with tempfile.TemporaryDirectory(prefix="qhlab-env-check-") as scratch:
        population = generate_population(small, "train", 0, Path(scratch) / "population", workers=1)
        described = describe_population(population)
    return {
        "environment": environment.name,
        "identity": environment.identity,
        "reward_unit": environment.reward_unit,
        "contract": contract,
        "starts": {"drawn": drawn, "distinct": len(starts), "preset_scenes": spec.scenes},
        # A misspelt optional member (``reward_units``) is not an error: it shows here as a default.
        "optional": {
            "declared": [m for m in OPTIONAL_MEMBERS if hasattr(environment.env, m)],
            "defaults": [m for m in OPTIONAL_MEMBERS if not hasattr(environment.env, m)],
        },
        "step_seconds": {"median": statistics.median(timings), "max": max(timings), "steps": len(timings)},
        "card": described["card"],
        "suggested": described["suggested"],
        "described": {k: described[k] for k in ("name", "split", "generator", "card", "suggested")},
    }
