"""hypergrad.run.surrogate: a Gaussian process of the validation loss conditioned on the
hypergradients (its kernel's derivative blocks against autograd, what gradients add), and the
Surrogate outer optimizer in the Trainer."""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest
import torch
from fixtures import lr_momentum, unit_clock
from torch.func import jacrev

import hypergrad as hg
from hypergrad.run.surrogate import GradientGP, Surrogate, expected_improvement


def _k(x: torch.Tensor, y: torch.Tensor, ell: float) -> torch.Tensor:
    return torch.exp(-0.5 / ell ** 2 * (x - y).pow(2).sum())


def test_the_kernel_blocks_are_the_kernels_derivatives() -> None:
    """cov(f(a), f'(b)), cov(f'(a), f(b)) and cov(f'(a), f'(b)) are the first and mixed
    second derivatives of the squared-exponential kernel (torch.func, float64)."""
    torch.manual_seed(0)
    K, ell = 3, 0.3
    a = torch.rand(2, K, dtype=torch.float64)
    b = torch.rand(3, K, dtype=torch.float64)
    C = GradientGP()._blocks(a, b, ell, torch.tensor([0, 1]), torch.tensor([1, 2]))
    assert C.shape == (2 + 2 * K, 3 + 2 * K)
    for i in range(2):
        for j in range(3):
            assert float(C[i, j]) == pytest.approx(float(_k(a[i], b[j], ell)), rel=1e-12)
    # f(a_0) with the gradient at b_2 (the second gradient point of b)
    torch.testing.assert_close(C[0, 3 + K:3 + 2 * K], jacrev(_k, argnums=1)(a[0], b[2], ell))
    # the gradient at a_1 with f(b_0)
    torch.testing.assert_close(C[2 + K:2 + 2 * K, 0], jacrev(_k, argnums=0)(a[1], b[0], ell))
    # the gradient at a_0 with the gradient at b_1
    torch.testing.assert_close(C[2:2 + K, 3:3 + K],
                               jacrev(jacrev(_k, argnums=0), argnums=1)(a[0], b[1], ell))


def _bowl(u: torch.Tensor) -> torch.Tensor:
    """A smooth test function on [0, 1]^K: a bowl with a ripple along the first axis."""
    return ((u - 0.35) ** 2).sum(-1) + 0.05 * torch.sin(6 * u[..., 0]) + 0.2


def test_gradients_make_the_model_closer_to_the_function() -> None:
    """Conditioned on the same values (6 random points of a smooth function in 2-d, 8 draws),
    the model that also has the gradients predicts the function between the points better on
    average; at an observed point its mean is the value and its uncertainty small."""
    K = 2

    err: dict[str, list[float]] = {"values": [], "gradients": []}
    for seed in range(8):
        torch.manual_seed(seed)
        u = torch.rand(6, K, dtype=torch.float64)
        x = torch.rand(200, K, dtype=torch.float64)
        g = torch.vmap(jacrev(_bowl))(u)
        for name, gi in [("values", torch.zeros(0, dtype=torch.long)),
                         ("gradients", torch.arange(6))]:
            gp = GradientGP(noise=1e-8).fit(u, _bowl(u), gi, g[gi])
            mu, sd = gp.predict(x)
            pred = torch.exp(mu) + gp.shift  # back from the model's log units
            err[name].append(float((pred - _bowl(x)).abs().mean()))
            m0, s0 = gp.predict(u[:1])
            assert float(torch.exp(m0) + gp.shift) == pytest.approx(float(_bowl(u[:1])), rel=1e-3)
            assert float(s0) < 0.05 * float(sd.mean())
    mean = {k: sum(v) / len(v) for k, v in err.items()}
    assert mean["gradients"] < 0.75 * mean["values"], mean


def test_gradients_that_do_not_describe_the_values_are_discounted() -> None:
    """Hypergradients of a rough loss (the slope plus ripples 100 times larger, as at the
    language model's long horizon) against the values of its smooth trend: the model bound to
    them as exact slopes (``grad_noise=(0.0,)``, the default before) predicts the trend between
    the points far worse than one of the values alone; the default chooses a large gradient
    noise and predicts about as well as the values alone. Exact gradients keep a small one."""
    K = 2

    err: dict[str, list[float]] = {"values": [], "exact": [], "default": []}
    shares: dict[str, list[float]] = {"rough": [], "smooth": []}
    for seed in range(6):
        torch.manual_seed(seed)
        u = torch.rand(8, K, dtype=torch.float64)
        x = torch.rand(200, K, dtype=torch.float64)
        g = torch.vmap(jacrev(_bowl))(u)
        rough = g + 30 * torch.randn(g.shape, dtype=g.dtype)
        every = torch.arange(8)
        for name, gp in [("values", GradientGP(noise=1e-8).fit(u, _bowl(u), every[:0], g[:0])),
                         ("exact", GradientGP(noise=1e-8, grad_noise=(0.0,)).fit(
                             u, _bowl(u), every, rough)),
                         ("default", GradientGP(noise=1e-8).fit(u, _bowl(u), every, rough))]:
            mu, _ = gp.predict(x)
            err[name].append(float((torch.exp(mu) + gp.shift - _bowl(x)).abs().mean()))
            if name == "default":
                shares["rough"].append(gp.grad_share)
        shares["smooth"].append(GradientGP(noise=1e-8).fit(u, _bowl(u), every, g).grad_share)
    mean = {k: sum(v) / len(v) for k, v in err.items()}
    assert mean["exact"] > 10 * mean["values"], mean
    assert mean["default"] < 1.2 * mean["values"], mean
    assert min(shares["rough"]) >= 100 and max(shares["smooth"]) <= 1, shares
    with pytest.raises(ValueError, match=r"grad_noise=\(-1.0,\) must be shares >= 0"):
        GradientGP(grad_noise=(-1.0,))
    with pytest.raises(ValueError, match=r"grad_noise=\(\) must be"):
        Surrogate([torch.zeros(2, dtype=torch.float64, requires_grad=True)], grad_noise=())


class _Noise(hg.ReverseMode):
    """Reverse mode's hypergradient replaced by large seeded noise (a point's own draw): slopes
    that describe none of the losses between the points."""

    def hypergradient(self, problem: Any, lam: torch.Tensor) -> Any:
        h = super().hypergradient(problem, lam)
        g = torch.Generator().manual_seed(int(abs(float(lam.sum())) * 1e6) % 2**31)
        return h._replace(grad=1e3 * torch.randn(h.grad.shape, generator=g,
                                                 dtype=h.grad.dtype))


def test_the_trainer_says_once_when_the_hypergradients_do_not_describe_the_losses() -> None:
    """K = 24 (the default Surrogate): with exact hypergradients the model keeps them as slopes
    and the Trainer says nothing; with hypergradients that contradict the plain runs' losses
    the model chooses a large noise for them and the Trainer says so, once, naming the guide."""
    from hypergrad.testing import digits_case

    class Said(hg.Callback):
        def __init__(self) -> None:
            self.said: list[str] = []

        def on_message(self, trainer: Any, text: str) -> None:
            self.said.append(text)

    for method, rough in [(hg.ReverseMode(), False), (_Noise(), True)]:
        p = digits_case("sgd", "per_example", steps=4, windows=3, n_train=24, seed=0)
        said = Said()
        tr = hg.Trainer(p, method=method, mode=hg.Offline(outer_steps=3, start=3, recheck=0),
                        callbacks=[hg.run.Log(None), hg.run.Progress(False), said])
        tr.fit()
        assert isinstance(tr.outer, Surrogate) and tr.outer.last_fit is not None
        told = [t for t in said.said if "do not describe the validation losses" in t]
        assert len(told) == int(rough), said.said
        assert (tr.outer.last_fit[1] >= 100) == rough
        if rough:
            assert "docs/troubleshooting.md, 'Rough losses'" in told[0]


def test_once_the_model_treats_the_hypergradients_as_noise_the_time_left_goes_to_plain_runs(
        ) -> None:
    """On a clock where a plain run costs 1 and a hypergradient 5, with hypergradients that
    contradict the losses: after the outer step whose model treats them as noise, no further
    hypergradient is taken and the time left goes to plain runs at the surrogate's proposals,
    within the budget; ``SearchSettings(rough_plain=False)`` keeps taking hypergradients, and
    exact ones are taken until the budget's end."""
    from hypergrad.testing import digits_case

    def run(method: hg.Method, **search: Any) -> tuple[hg.TrainResult, list[float]]:
        p = digits_case("sgd", "per_example", steps=4, windows=3, n_train=24, seed=0)
        tr = hg.Trainer(p, method=method, guards=hg.Guards(time_budget=30.0),
                        # one order: a hypergradient costs 5 on this clock
                        mode=hg.Offline.default(search={"two_orders": 0, **search}),
                        callbacks=[hg.run.Log(None), hg.run.Progress(False)])
        clock = unit_clock(tr)
        return tr.fit(), clock

    res, clock = run(_Noise())
    assert len(res.history) == 1 and res.out_of_time and clock[0] <= 30.0
    assert sum(e["kind"] == "leftover" for e in res.evaluations) >= 8
    kept, _ = run(_Noise(), rough_plain=False)
    assert len(kept.history) > 1
    exact, _ = run(hg.ReverseMode())
    assert len(exact.history) > 1
    with pytest.raises(TypeError, match="rough_plain=1 must be True or False"):
        hg.run.SearchSettings(rough_plain=1)  # type: ignore[arg-type]


def test_expected_improvement_prefers_a_lower_mean_and_more_uncertainty() -> None:
    mu = torch.tensor([0.0, -1.0, 0.0])
    sd = torch.tensor([0.1, 0.1, 1.0])
    ei = expected_improvement(mu, sd, 0.0)
    assert float(ei[1]) > float(ei[0]) and float(ei[2]) > float(ei[0]) > 0


def test_the_surrogate_in_the_trainer_models_every_evaluation_and_searches_the_box() -> None:
    """Trainer(outer=partial(Surrogate)): it gets the Trainer's box; every plain run and every
    hypergradient joins its model (the hypergradient as the gradient in box units: the mean of
    the problem's batch order's and variant 2's, ``SearchSettings.two_orders``); its trials lie
    in the box; each next hypergradient is at a point that had none."""
    p = lr_momentum()
    tr = hg.Trainer(p, outer=functools.partial(Surrogate, trials=2),
                    guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                    mode=hg.Offline(outer_steps=3, start=3, recheck=0),
                    callbacks=[hg.run.Log(None), hg.run.Progress(False)])
    sur = tr.outer
    assert isinstance(sur, Surrogate) and sur.box is not None
    assert torch.equal(sur.box[0], tr.box[0]) and torch.equal(sur.box[1], tr.box[1])
    res = tr.fit()
    searched = [e for e in res.evaluations if e["kind"] == "line search"]
    assert len(searched) == 2 * len(res.history)  # its trials: 2 per outer step
    lo, hi = tr.box
    for e in searched:
        assert bool(((e["lam"] >= lo - 1e-9) & (e["lam"] <= hi + 1e-9)).all())
    units = [tuple(x.tolist()) for x in sur.xs]
    assert len(set(units)) == len(units)  # every point once
    assert len(sur.xs) == len({tuple(e["lam"].tolist()) for e in res.evaluations}
                              | {tuple(x.tolist()) for x in _hypergradient_points(tr, sur)})
    assert len(sur.grads) == len(res.history)  # one gradient per hypergradient, each new
    for i, g in sur.grads.items():  # the hypergradient at its point, in box units
        x = sur._raw(sur.xs[i], tr.lam)
        own = tr.method.hypergradient(p, x).grad
        with p.variant(2):
            other = tr.method.hypergradient(p, x).grad
        assert not torch.allclose(own, other)  # the orders differ: the mean is not either
        want = (own + other) / 2 * (hi - lo)
        torch.testing.assert_close(g, want.double(), rtol=1e-9, atol=1e-12)


def _hypergradient_points(tr: hg.Trainer, sur: Surrogate) -> list[torch.Tensor]:
    return [sur._raw(sur.xs[i], tr.lam) for i in sur.grads]


def test_a_surrogate_without_a_box_says_so() -> None:
    lam = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    sur = Surrogate([lam])
    with pytest.raises(ValueError, match="needs the search box"):
        sur.observe(lam.detach(), 1.0)
    with pytest.raises(ValueError, match="trials=0"):
        Surrogate([lam], trials=0)


def test_the_default_outer_is_the_surrogate_for_16_to_100_hyperparameters() -> None:
    from hypergrad.run.outer import SURROGATE_K, QuasiNewton, default_outer

    box = (torch.zeros(30, dtype=torch.float64), torch.ones(30, dtype=torch.float64))
    for k, kind in [(2, QuasiNewton), (15, QuasiNewton), (16, Surrogate), (100, Surrogate),
                    (101, QuasiNewton)]:
        lam = torch.zeros(k, dtype=torch.float64)
        got = default_outer([lam], (box[0][:1].expand(k), box[1][:1].expand(k)))
        assert type(got) is kind, k
        assert (k in SURROGATE_K) == (kind is Surrogate)
    assert isinstance(default_outer([torch.zeros(30)], online=True), torch.optim.Adam)


def test_each_training_seed_draws_its_own_candidates() -> None:
    """The Trainer seeds its Surrogate's candidate generator with the problem's seed (as its
    quasi-random start): every seed of a study draws other candidate points, not seed 0's; a
    seed the user gives is kept."""
    from hypergrad.testing import digits_case

    def outer(seed: int, **kw: Any) -> Surrogate:
        p = digits_case("sgd", "per_example", steps=4, windows=3, n_train=24, seed=seed)
        assert p.init_raw().numel() == 24 and p.seed == seed
        got = hg.Trainer(p, callbacks=[hg.run.Log(None), hg.run.Progress(False)], **kw).outer
        assert isinstance(got, Surrogate)
        return got

    a, b, again = outer(3), outer(4), outer(3)
    assert (a.seed, b.seed) == (3, 4)
    assert torch.equal(a.gen.get_state(), again.gen.get_state())
    assert not torch.equal(a.gen.get_state(), b.gen.get_state())
    assert outer(3, outer=functools.partial(Surrogate, seed=11)).seed == 11
    assert Surrogate([torch.zeros(2)]).seed is None  # standalone: generator seeded 0


def test_a_resumed_surrogate_keeps_its_observations(tmp_path: Any) -> None:
    """Its observations travel in the Trainer's checkpoint: a run resumed from the checkpoint
    of outer step 1 ends where the uninterrupted run ends."""
    kw: dict[str, Any] = dict(outer=functools.partial(Surrogate, trials=2),
                              guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}),
                              callbacks=[hg.run.Log(None), hg.run.Progress(False)])
    whole = hg.Trainer(lr_momentum(), mode=hg.Offline(outer_steps=2, start=2, recheck=0), **kw)
    full = whole.fit()
    first = hg.Trainer(lr_momentum(), mode=hg.Offline(outer_steps=1, start=2, recheck=0),
                       folder=tmp_path, **kw)
    first.fit()
    saved = first.outer
    back = hg.Trainer(lr_momentum(), mode=hg.Offline(outer_steps=2, start=2, recheck=0),
                      folder=hg.RunFolder(tmp_path, resume=True), **kw)
    assert isinstance(back.outer, Surrogate) and isinstance(saved, Surrogate)
    assert len(back.outer.xs) > 0 and set(back.outer.grads) <= set(saved.grads)
    assert back.outer.fs == saved.fs[:len(back.outer.fs)]
    res = back.fit()
    assert torch.equal(res.lam, full.lam)


def test_the_time_left_goes_to_the_surrogates_proposals() -> None:
    """On a clock where a plain run costs 1 and a hypergradient 5, the time left after the
    last hypergradient goes to plain runs at the surrogate's proposals (in the box, each
    joining its model), and the run ends within its budget."""
    p = lr_momentum()
    tr = hg.Trainer(p, outer=functools.partial(Surrogate, trials=2),
                    guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}, time_budget=36.0),
                    mode=hg.Offline.default(search={"two_orders": 0}),  # a hypergradient: 5
                    callbacks=[hg.run.Log(None), hg.run.Progress(False)])
    clock = unit_clock(tr)
    res = tr.fit()
    assert clock[0] <= 36.0 and res.out_of_time
    left = [e for e in res.evaluations if e["kind"] == "leftover"]
    assert left
    sur = tr.outer
    assert isinstance(sur, Surrogate)
    lo, hi = tr.box
    sobol = tr._space_filling(20, 0)  # what the time left would get without a surrogate
    for e in left:
        assert bool(((e["lam"] >= lo) & (e["lam"] <= hi)).all())
        assert any(torch.allclose(sur._unit(e["lam"]), x, atol=1e-12) for x in sur.xs)
        assert not any(torch.allclose(e["lam"], x) for x in sobol)


def _observed(n: int, K: int, with_grads: int, seed: int = 0) -> Surrogate:
    """A standalone Surrogate in the unit box of ``K`` with ``n`` observations of a smooth
    function, ``with_grads`` of them with its gradient."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.zeros(K, dtype=torch.float64, requires_grad=True)
    box = (torch.zeros(K, dtype=torch.float64), torch.ones(K, dtype=torch.float64))
    sur = Surrogate([x], box=box, candidates=64, seed=seed)
    for i in range(n):
        u = torch.rand(K, generator=gen, dtype=torch.float64)
        v = float((u - 0.3).pow(2).sum())
        sur.observe(u, v, 2 * (u - 0.3) if i < with_grads else None)
    return sur


def test_within_its_caps_the_model_is_fitted_to_every_observation() -> None:
    """The caps (MAX_VALUES, MAX_ROWS) leave a run within them as it was: the model sees
    every value and hypergradient, and the proposal is the one of the model of all."""
    from hypergrad.run.surrogate import _key

    sur = _observed(30, 5, 6)
    assert sur._kept() == (list(range(30)), list(range(6)))
    state = sur.gen.get_state()
    got = sur.propose()
    sur.gen.set_state(state)  # the same candidates, for the model of everything by hand
    cand = sur._candidates()
    u, f = torch.stack(sur.xs), torch.tensor(sur.fs, dtype=torch.float64)
    gp = GradientGP().fit(u, f, torch.arange(6), torch.stack([sur.grads[i] for i in range(6)]))
    seen = {_key(x) for x in sur.xs}
    cand = cand[torch.tensor([_key(c) not in seen for c in cand])]
    mu, sd = gp.predict(cand)
    assert torch.equal(got, cand[int(torch.argmax(expected_improvement(mu, sd,
                                                                        gp.warp(float(f.min())))))])


def test_a_long_run_fits_its_model_to_a_bounded_number_of_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The model grew by K rows per hypergradient and cost O((steps K)^3) per proposal: 7.5 s
    per outer step at K = 64 after 25 steps (the long-runs probe). Past the caps it keeps the
    lowest losses' hypergradients (and the best and most recent values)."""
    from hypergrad.run.surrogate import MAX_ROWS, MAX_VALUES

    sizes: list[tuple[int, int]] = []
    fit = GradientGP.fit

    def spy(self: GradientGP, u: torch.Tensor, f: torch.Tensor, gi: torch.Tensor,
            g: torch.Tensor) -> GradientGP:
        sizes.append((len(u), len(u) + g.numel()))
        return fit(self, u, f, gi, g)

    monkeypatch.setattr(GradientGP, "fit", spy)
    sur = _observed(MAX_VALUES + 100, 20, 60)
    points, grads = sur._kept()
    assert len(points) == MAX_VALUES and len(points) + 20 * len(grads) <= MAX_ROWS
    best = sorted(range(len(sur.fs)), key=sur.fs.__getitem__)
    assert set(best[:MAX_VALUES // 2]) <= set(points)
    assert set(range(len(sur.fs) - 50, len(sur.fs))) <= set(points)  # the most recent
    with_grad = [i for i in best if i in sur.grads and i in set(points)]
    assert grads == sorted(with_grad[:len(grads)]) and len(grads) == (MAX_ROWS - MAX_VALUES) // 20
    sur.propose()
    assert sizes == [(MAX_VALUES, len(points) + 20 * len(grads))]
    # a hypergradient wider than the cap: the best one is still kept
    wide = _observed(10, MAX_ROWS + 8, 3)
    assert len(wide._kept()[1]) == 1


def test_the_budget_forecasts_a_step_with_the_searchs_own_time() -> None:
    """A surrogate's proposals take time of their own (a model refitted per trial: 4 s a step
    where its runs took 0.05): the next step's forecast was its hypergradient and one plain
    run alone (6 here), and the run went past its budget. On a clock where a proposal costs 3,
    a plain run 1 and a hypergradient 5, the next step is forecast at 5 + 1 + 3."""
    said: list[str] = []
    tr = hg.Trainer(lr_momentum(), outer=functools.partial(Surrogate, trials=2),
                    guards=hg.Guards(bounds={"lr": (1e-3, 1.0)}, time_budget=60.0),
                    mode=hg.Offline.default(search={"two_orders": 0}),
                    callbacks=[hg.run.Log(said.append), hg.run.Progress(False)])
    clock = unit_clock(tr)
    assert isinstance(tr.outer, Surrogate)
    propose = tr.outer.propose

    def slow() -> torch.Tensor:
        clock[0] += 3.0
        return propose()

    tr.outer.propose = slow  # type: ignore[method-assign]
    tr.fit()
    stop = next(m for m in said if "stopped before outer step" in m)
    assert "the next would take about 9 s" in stop, stop
    assert clock[0] <= 60.0
    # the point returned named by its loss too: points of one outer step share its number
    back = next(m for m in said if "re-checked" in m)
    assert re.search(r"returned the one of outer step \d+ at [\d.]+ in the tuning's order", back)
