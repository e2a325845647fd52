"""Scorer family: every arm builds with encoder/fusion/readout, right shapes, symmetries, masks."""

from __future__ import annotations

import pytest
import torch

from qhlab.finite_horizon.architecture import ARMS, COMPONENT_KINDS, ArchitectureConfig, ScorerDims, register_arm
from qhlab.finite_horizon.scorer import QhEnsemble, build_scorer, scorer_members

DIMS = ScorerDims(object_features=6, goal_features=3, candidate_features=5, horizon=3)
B, N, K = 4, 5, 8


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    object_mask = torch.ones(B, N, dtype=torch.bool)
    object_mask[0, 3:] = False  # state 0 has 3 pucks
    object_mask[1, 4:] = False
    objects = torch.randn(B, N, DIMS.object_features, generator=g) * object_mask.unsqueeze(-1)
    candidate_mask = torch.ones(B, K, dtype=torch.bool)
    candidate_mask[2, 6:] = False
    n_real = object_mask.sum(1, keepdim=True)
    candidate_object = torch.randint(0, 1000, (B, K), generator=g) % n_real
    return {
        "objects": objects,
        "object_mask": object_mask,
        "goal": torch.randn(B, DIMS.goal_features, generator=g),
        "candidates": torch.randn(B, K, DIMS.candidate_features, generator=g),
        "candidate_object": candidate_object,
        "candidate_mask": candidate_mask,
    }


def _scorer(arm: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_scorer(ArchitectureConfig(arm=arm), DIMS).eval()


def _q(scorer: torch.nn.Module, x: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return scorer(
            x["objects"], x["object_mask"], x["goal"], x["candidates"], x["candidate_object"], x["candidate_mask"]
        )


def test_registered_arms() -> None:
    assert set(ARMS) >= {
        "baseline",
        "control_global_readout",
        "control_no_interaction",
        "variant_cross_attention",
        "variant_deep",
    }
    with pytest.raises(ValueError, match="already registered"):
        register_arm("baseline", encoder="attention", fusion="concat", readout="local")
    with pytest.raises(ValueError, match="fusion='film' is not allowed; allowed: concat, cross_attention"):
        register_arm("variant_film", encoder="attention", fusion="film", readout="local")
    assert "variant_film" not in ARMS


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_arm_builds_with_named_parts_and_shape(arm: str) -> None:
    scorer = _scorer(arm)
    names = {name for name, _ in scorer.named_children()}
    assert {"encoder", "fusion", "readout"} <= names
    q = _q(scorer, _inputs())
    assert q.shape == (B, K, DIMS.horizon) and q.dtype == torch.float32
    assert torch.isfinite(q).all()
    assert (q[2, 6:] == 0).all()  # masked candidates: finite placeholder
    # every parameter receives a gradient from a loss on valid candidates
    scorer.train()
    x = _inputs()
    out = scorer(x["objects"], x["object_mask"], x["goal"], x["candidates"], x["candidate_object"], x["candidate_mask"])
    out.square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in scorer.parameters())


def test_arm_structures_differ_as_declared() -> None:
    kinds = {
        arm: (
            type(_scorer(arm).encoder).__name__,
            type(_scorer(arm).fusion).__name__,
            type(_scorer(arm).readout).__name__,
        )
        for arm in ARMS
    }
    assert kinds["baseline"] == ("AttentionEncoder", "ConcatFusion", "LocalReadout")
    assert kinds["control_global_readout"][2] == "GlobalReadout"
    assert kinds["control_no_interaction"][0] == "DeepSetsEncoder"
    assert kinds["variant_cross_attention"][1] == "CrossAttentionFusion"
    assert len(_scorer("variant_deep").encoder.blocks) > len(_scorer("baseline").encoder.blocks)


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_masked_objects_do_not_change_outputs(arm: str) -> None:
    scorer = _scorer(arm)
    x = _inputs()
    y = {k: v.clone() for k, v in x.items()}
    y["objects"][0, 3:] = torch.randn(N - 3, DIMS.object_features) * 100.0
    y["objects"][1, 4:] = 7.0
    torch.testing.assert_close(_q(scorer, x), _q(scorer, y), rtol=0, atol=1e-6)


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_object_permutation_invariance_and_candidate_equivariance(arm: str) -> None:
    scorer = _scorer(arm)
    x = _inputs()
    base = _q(scorer, x)
    # permute the object slots (and re-point candidate_object): Q unchanged
    perm = torch.tensor([4, 2, 0, 3, 1])
    inverse = torch.argsort(perm)
    y = dict(x)
    y["objects"] = x["objects"][:, perm]
    y["object_mask"] = x["object_mask"][:, perm]
    y["candidate_object"] = inverse[x["candidate_object"]]
    torch.testing.assert_close(_q(scorer, y), base, rtol=1e-5, atol=1e-5)
    # permute the candidates: Q permutes the same way
    cperm = torch.randperm(K, generator=torch.Generator().manual_seed(3))
    z = dict(x)
    for key in ("candidates", "candidate_object", "candidate_mask"):
        z[key] = x[key][:, cperm]
    torch.testing.assert_close(_q(scorer, z), base[:, cperm], rtol=1e-5, atol=1e-5)


def test_global_readout_ignores_candidate_object() -> None:
    scorer = _scorer("control_global_readout")
    x = _inputs()
    y = dict(x)
    y["candidate_object"] = (x["candidate_object"] + 1) % x["object_mask"].sum(1, keepdim=True)
    assert not torch.equal(y["candidate_object"], x["candidate_object"])
    torch.testing.assert_close(_q(scorer, x), _q(scorer, y), rtol=0, atol=0)
    local = _scorer("baseline")
    assert not torch.allclose(_q(local, x), _q(local, y))


def test_no_interaction_encoder_keeps_objects_independent() -> None:
    scorer = _scorer("control_no_interaction")
    x = _inputs()
    y = {k: v.clone() for k, v in x.items()}
    y["objects"][:, 1] += 1.0
    with torch.no_grad():
        a, _ = scorer.encoder(x["objects"], x["object_mask"], x["goal"])
        b, _ = scorer.encoder(y["objects"], y["object_mask"], y["goal"])
    torch.testing.assert_close(a[:, [0, 2]], b[:, [0, 2]], rtol=0, atol=0)
    attention = _scorer("baseline")
    with torch.no_grad():
        c, _ = attention.encoder(x["objects"], x["object_mask"], x["goal"])
        d, _ = attention.encoder(y["objects"], y["object_mask"], y["goal"])
    assert not torch.allclose(c[:, 0], d[:, 0])


def test_sizes_follow_config_and_dims_are_validated() -> None:
    small = build_scorer(ArchitectureConfig(arm="baseline", encoder={"width": 16, "heads": 2}), DIMS)
    large = build_scorer(ArchitectureConfig(arm="baseline"), DIMS)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(small) < count(large)
    with pytest.raises(ValueError, match="horizon=0"):
        ScorerDims(object_features=1, goal_features=1, candidate_features=1, horizon=0)


def _readout_inputs(width: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    fused = torch.randn(B, K, width, generator=g)
    per_object = torch.randn(B, N, width, generator=g)
    struck = torch.randint(0, 3, (B, K), generator=g)
    objects = torch.randn(B, N, DIMS.object_features, generator=g)
    candidates = torch.randn(B, K, DIMS.candidate_features, generator=g)
    return fused, per_object, struck, objects, candidates


def test_local_readout_reads_the_struck_puck_raw_features_only() -> None:
    readout = _scorer("baseline").readout
    fused, per_object, struck, objects, candidates = _readout_inputs(64)
    with torch.no_grad():
        base = readout(fused, per_object, struck, objects, candidates)
        # an unstruck slot (index 4 >= every struck index) is invisible to the readout...
        other = objects.clone()
        other[:, 4] += 5.0
        torch.testing.assert_close(readout(fused, per_object, struck, other, candidates), base, rtol=0, atol=0)
        # ...while the struck puck's raw features reach it through the skip path
        hit = objects.clone()
        hit[0, struck[0, 0]] += 5.0
        moved = readout(fused, per_object, struck, hit, candidates)
    assert not torch.allclose(moved[0, 0], base[0, 0])


def test_global_readout_never_reads_any_puck() -> None:
    readout = _scorer("control_global_readout").readout
    fused, per_object, struck, objects, candidates = _readout_inputs(64)
    with torch.no_grad():
        base = readout(fused, per_object, struck, objects, candidates)
        other = readout(fused, per_object + 3.0, (struck + 1) % 3, objects * -2.0, candidates)
        moved = readout(fused, per_object, struck, objects, candidates + 1.0)
    torch.testing.assert_close(other, base, rtol=0, atol=0)
    assert not torch.allclose(moved, base)


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_q_heads_compute_in_float32_under_a_bf16_autocast(arm: str) -> None:
    """Q values are compared at tie_band (1 mm): a bf16 output would step by 2-4 mm at 0.5-1 m."""
    scorer, x = _scorer(arm), _inputs()
    head = scorer.readout.mlp[-1]
    seen = {}
    hook = head.register_forward_hook(lambda module, args, out: seen.update(inputs=args[0], out=out))
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            q = scorer(
                x["objects"], x["object_mask"], x["goal"], x["candidates"], x["candidate_object"], x["candidate_mask"]
            )
    finally:
        hook.remove()
    assert seen["inputs"].dtype == torch.bfloat16  # the layers before the head ran under the autocast
    assert q.dtype == torch.float32
    expected = torch.nn.functional.linear(seen["inputs"].float(), head.weight, head.bias)
    assert torch.equal(seen["out"], expected)


def test_the_float32_head_is_a_plain_linear_without_autocast() -> None:
    """Same initial weights, names and float32 arithmetic as before the head existed."""
    from qhlab.finite_horizon.components import _mlp

    torch.manual_seed(3)
    plain = _mlp(7, 12, 3)
    torch.manual_seed(3)
    head = _mlp(7, 12, 3, float32_out=True)
    assert type(head[-1]) is not torch.nn.Linear and isinstance(head[-1], torch.nn.Linear)
    assert plain.state_dict().keys() == head.state_dict().keys()
    assert all(torch.equal(plain.state_dict()[k], head.state_dict()[k]) for k in plain.state_dict())
    x = torch.randn(5, 7)
    assert torch.equal(plain(x), head(x))


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_a_zero_q_head_outputs_zero_and_leaves_every_other_parameter_as_drawn(arm: str) -> None:
    """q_head_init='zero' removes the seed's initial function, nothing else."""
    torch.manual_seed(5)
    drawn = build_scorer(ArchitectureConfig(arm=arm), DIMS)
    torch.manual_seed(5)
    zeroed = build_scorer(ArchitectureConfig(arm=arm), DIMS, q_head_init="zero")
    head = {f"readout.mlp.{len(zeroed.readout.mlp) - 1}.{p}" for p in ("weight", "bias")}
    for name, value in zeroed.state_dict().items():
        if name in head:
            assert not value.any() and drawn.state_dict()[name].any(), name
        else:
            assert torch.equal(value, drawn.state_dict()[name]), name
    x = _inputs()
    assert not _q(zeroed, x).any()
    # the RNG advanced exactly as for a random head: the next draw is the same
    torch.manual_seed(5)
    build_scorer(ArchitectureConfig(arm=arm), DIMS)
    after_drawn = torch.rand(1)
    torch.manual_seed(5)
    build_scorer(ArchitectureConfig(arm=arm), DIMS, q_head_init="zero")
    assert torch.equal(torch.rand(1), after_drawn)


def test_a_zero_q_head_still_learns() -> None:
    """A zero head passes gradients to itself at once and to the layers before it after one step."""
    torch.manual_seed(0)
    scorer = build_scorer(ArchitectureConfig(arm="baseline"), DIMS, q_head_init="zero")
    x = _inputs()
    optimizer = torch.optim.AdamW(scorer.parameters(), lr=1e-2, weight_decay=0.0)  # no decay: only gradients move
    first = scorer.encoder.embed_object.weight.detach().clone()
    grads = []
    for _ in range(2):
        optimizer.zero_grad()
        q = scorer(
            x["objects"], x["object_mask"], x["goal"], x["candidates"], x["candidate_object"], x["candidate_mask"]
        )
        (q - 1.0).pow(2).mean().backward()
        grads.append(scorer.encoder.embed_object.weight.grad.abs().sum().item())
        optimizer.step()
    assert grads[0] == 0.0 and grads[1] > 0.0  # the zero head blocks the first step only
    assert _q(scorer, x).abs().sum() > 0
    assert not torch.equal(scorer.encoder.embed_object.weight, first)


def test_an_unknown_q_head_init_is_refused_by_the_builder() -> None:
    with pytest.raises(ValueError, match=r"q_head_init='ones' is not allowed; allowed: random, zero"):
        build_scorer(ArchitectureConfig(arm="baseline"), DIMS, q_head_init="ones")


def test_a_zero_q_head_is_refused_where_the_float32_head_is_not_the_last_layer(request) -> None:
    """A custom readout with a layer after its float32 head would not start at Q = 0: refused."""
    from qhlab.finite_horizon import scorer as scorer_module

    def builder(arch, dims):
        built = scorer_module._compose(arch, dims)
        built.readout.mlp.append(torch.nn.Linear(dims.horizon, dims.horizon))
        return built

    register_arm("late_head", encoder="attention", fusion="concat", readout="local", builder=builder)
    request.addfinalizer(lambda: ARMS.pop("late_head"))  # the real registry keeps only its own arms
    arch = ArchitectureConfig(arm="late_head")
    assert _q(build_scorer(arch, DIMS), _inputs()).abs().sum() > 0  # "random" builds it as declared
    with pytest.raises(
        ValueError,
        match=r"q_head_init='zero' with arm='late_head' is not allowed: its readout has "
        r"1 float32 Q head\(s\), not its last Linear",
    ):
        build_scorer(arch, DIMS, q_head_init="zero")


@pytest.mark.parametrize("q_head_init", ["random", "zero"])
def test_an_ensemble_draws_its_members_one_after_another_and_outputs_their_mean(q_head_init: str) -> None:
    """Member 0 is the plain scorer of the seed, member 1 the RNG's next one; Q is the mean."""
    arch = ArchitectureConfig(arm="baseline")
    torch.manual_seed(3)
    first = build_scorer(arch, DIMS, q_head_init=q_head_init)
    second = build_scorer(arch, DIMS, q_head_init=q_head_init)
    after = torch.rand(1)
    torch.manual_seed(3)
    ensemble = build_scorer(arch, DIMS, q_head_init=q_head_init, members=2)
    assert torch.equal(torch.rand(1), after)  # it drew exactly two scorers
    assert isinstance(ensemble, QhEnsemble) and scorer_members(ensemble) == list(ensemble.members)
    for plain, member in zip((first, second), ensemble.members, strict=True):
        assert plain.state_dict().keys() == member.state_dict().keys()
        assert all(torch.equal(v, member.state_dict()[k]) for k, v in plain.state_dict().items())
    x = _inputs()
    q = _q(ensemble, x)
    torch.testing.assert_close(q, (_q(first, x) + _q(second, x)) / 2, rtol=0, atol=1e-7)
    if q_head_init == "random":
        assert not torch.allclose(_q(first, x), _q(second, x))  # two initializations, not one twice
    else:
        assert not q.any()
    assert scorer_members(first) == [first]


@pytest.mark.parametrize("members", [0, 9, True, 2.0])
def test_an_ensemble_size_outside_1_to_8_is_refused_by_the_builder(members) -> None:
    with pytest.raises(ValueError, match=rf"members={members!r} is not allowed; allowed: an int in 1..8"):
        build_scorer(ArchitectureConfig(arm="baseline"), DIMS, members=members)
    with pytest.raises(ValueError, match=r"QhEnsemble: 1 member\(s\) is not allowed; allowed: >= 2"):
        QhEnsemble([build_scorer(ArchitectureConfig(arm="baseline"), DIMS)], DIMS)


def test_every_component_kind_an_architecture_names_has_a_builder() -> None:
    """The torch-free architecture's kinds and the scorer's component builders are the same sets."""
    from qhlab.finite_horizon import scorer as scorer_module

    assert {part: set(kinds) for part, kinds in COMPONENT_KINDS.items()} == {
        part: set(builders) for part, builders in scorer_module._KINDS.items()
    }
