from __future__ import annotations

import pytest
import torch

import hypergrad as hg
from hypergrad.data import MiniBatches


def test_layout_values_and_transforms(f64: torch.dtype) -> None:
    hps = hg.HyperParams([
        hg.Schedule("lr", [0.1, 0.2, 0.3], windows=3, transform="log"),
        hg.Scalar("mom", 0.9, transform="logit"),
        hg.PerTensor("wd", 1e-3, params=["a", "b"], transform="log"),
        hg.PerExample("w", 0.5, n=4, transform="logit"),
        hg.Array("l2", [1.0, 2.0]),
    ])
    assert hps.num_raw == 3 + 1 + 2 + 4 + 2
    lam = hps.init_raw(f64)
    assert lam.shape == (12,) and lam.dtype == f64
    v = hps.values(lam, step=5, horizon=6)  # last window
    torch.testing.assert_close(v["lr"], torch.tensor(0.3, dtype=f64))
    torch.testing.assert_close(v["mom"], torch.tensor(0.9, dtype=f64))
    assert set(v["wd"]) == {"a", "b"}
    torch.testing.assert_close(v["w"], torch.full((4,), 0.5, dtype=f64))
    assert hps.values(lam, step=None)["lr"].shape == (3,)
    assert hps.describe(lam)["l2"] == [1.0, 2.0]


@pytest.mark.parametrize("horizon,windows", [(10, 3), (7, 7), (5, 1), (100, 8)])
def test_schedule_windows_cover_the_horizon(horizon: int, windows: int) -> None:
    s = hg.Schedule("lr", 0.1, windows=windows)
    ws = [s.window(t, horizon) for t in range(horizon)]
    assert ws[0] == 0 and ws[-1] == windows - 1
    assert all(b - a in (0, 1) for a, b in zip(ws, ws[1:]))


def test_per_tensor_default_for_unlisted() -> None:
    p = hg.PerTensor("wd", 0.1, params=["a"], default=0.0).bind(["a", "b"])
    v = p.value(torch.zeros(1), 0, 1)
    assert v["b"] == 0.0 and float(v["a"]) == 0.0


def test_per_tensor_init_by_name_is_placed_by_name(f64: torch.dtype) -> None:
    # a list is read in the order of params (the model's order with params=None), which a user
    # of their own model can get wrong silently; a dict names each entry
    names = ["0.weight", "0.bias", "2.weight"]
    by_name = {"2.weight": 0.3, "0.weight": 0.1, "0.bias": 0.2}
    bound = hg.PerTensor("wd", by_name).bind(names)  # params=None: placed when bound
    assert bound.init == [0.1, 0.2, 0.3]
    torch.testing.assert_close(bound.init_raw(f64), torch.tensor([0.1, 0.2, 0.3], dtype=f64))
    listed = hg.PerTensor("wd", {"2.weight": 0.3, "0.bias": 0.2}, params=["0.bias", "2.weight"],
                          default=0.0)
    assert listed.init == [0.2, 0.3]
    # and the fix for tuning only the one named (the per-layer probe, 2026-12-07)
    with pytest.raises(ValueError, match=r"gives no value for \['0.bias', '2.weight'\].*; or, "
                                         r"to tune only those it names, pass "
                                         r"params=\['0.weight'\] too \(the others then read "
                                         r"default=<constant>\)\.$"):
        hg.PerTensor("wd", {"0.weight": 0.1}).bind(names)
    with pytest.raises(ValueError, match=r"names \['fc1.weight'\], which are not tuned"):
        hg.PerTensor("wd", {**by_name, "fc1.weight": 1.0}).bind(names)
    with pytest.raises(ValueError, match=r"init\['0.bias'\]=\[1, 2\] must be one number"):
        hg.PerTensor("wd", {**by_name, "0.bias": [1, 2]})
    with pytest.raises(TypeError, match="keys \\[3\\] that are not parameter names"):
        hg.PerTensor("wd", {3: 0.1})
    # a list of the wrong length says the order it is read in
    with pytest.raises(ValueError, match=r"in this order: \['0.weight', '0.bias', '2.weight'\]"):
        hg.PerTensor("wd", [0.1, 0.2]).bind(names).init_raw(f64)


def test_minibatches_are_deterministic_epochs() -> None:
    x = torch.arange(10.0)[:, None]
    mb = MiniBatches(x, batch_size=3, seed=4)
    assert mb.per_epoch == 3
    a = [mb(t)[1].tolist() for t in range(6)]
    b = [MiniBatches(x, batch_size=3, seed=4)(t)[1].tolist() for t in range(6)]
    assert a == b
    first_epoch = sum(a[:3], [])
    assert len(set(first_epoch)) == 9  # no repeats inside an epoch
    assert a[:3] != a[3:]  # a new shuffle each epoch
    with pytest.raises(ValueError, match="batch_size=11 is larger than the 10 examples"):
        MiniBatches(x, batch_size=11)
    with pytest.raises(ValueError, match="tensor 1 has 2 rows"):
        MiniBatches(x, torch.zeros(2), batch_size=1)
    with pytest.raises(ValueError, match=r"has 0 examples \(tensor 0 has shape \(0, 6\)\)"):
        MiniBatches(torch.zeros(0, 6), torch.zeros(0), batch_size=25)  # 'use batch_size <= 0'
    # what is not a tensor is named with its fix (a tuple was an AttributeError on .shape)
    with pytest.raises(TypeError, match=r"argument 0 is tuple.*MiniBatches\(x, y, \.\.\.\)"):
        MiniBatches((x, x), batch_size=2)
    with pytest.raises(TypeError, match=r"argument 1 is ndarray.*torch.as_tensor"):
        MiniBatches(x, x.numpy(), batch_size=2)
    with pytest.raises(TypeError, match=r"argument 0 is Tensor of shape \(\).*one row per"):
        MiniBatches(torch.tensor(1.0), batch_size=1)


def test_a_mapping_of_items_keyed_by_name() -> None:
    """The form the Hydra configs instantiate: ``{name: item}``, in the mapping's order."""
    hp = hg.HyperParams({"lr": hg.Schedule("lr", 0.1, windows=3), "m": hg.Scalar("m", 0.5)})
    assert hp.names == ["lr", "m"] and hp.num_raw == 4
    with pytest.raises(ValueError, match=r"key 'wd' is named 'l2'"):
        hg.HyperParams({"wd": hg.Scalar("l2", 0.1)})


def test_plain_steps_reuse_values_only_while_lam_and_the_window_stay() -> None:
    """A plain step computed the hyperparameters' values twice (loss and update); they are kept
    for the same lam (same object and version) and windows. An in-place change of lam, another
    window, or a kind of the user's own (which may read the step its own way) recompute."""
    from hypergrad.testing import digits_case

    p = digits_case("momentum", "schedule", steps=8, n_train=24, batch_size=8, hidden=4,
                    n_val=16, windows=4)
    lam = p.init_raw()
    a = p._step_values(lam, 0)
    assert p._step_values(lam, 1) is a  # window 0 covers steps 0-1
    b = p._step_values(lam, 2)
    assert b is not a  # window 1
    with torch.no_grad():
        lam.add_(0.5)  # the outer optimizer's in-place step
    c = p._step_values(lam, 2)
    assert c is not b and torch.allclose(c["lr"], b["lr"] * torch.exp(torch.tensor(0.5,
                                         dtype=torch.float64)), rtol=1e-12)
    assert p._step_values(lam.clone(), 2) is not c  # another tensor
    wrapped = lam.clone().requires_grad_()
    assert p._step_values(wrapped, 2) is not p._step_values(wrapped, 2)  # differentiated: never

    class Mine(hg.Scalar):  # a kind of the user's own
        pass

    hps = hg.HyperParams([hg.Schedule("lr", 0.1, windows=2), Mine("wd", 1e-3)])
    assert hps.step_key(0, 4) is None
    assert hg.HyperParams([hg.Schedule("lr", 0.1, windows=2)]).step_key(3, 4) == (1,)


def test_a_hyperparams_given_to_hyperparams_is_named() -> None:
    h = hg.HyperParams([hg.Scalar("lr", 0.1)])
    with pytest.raises(TypeError, match=r"items is a HyperParams already"):
        hg.HyperParams(h)  # type: ignore[arg-type]


def test_a_schedule_init_of_another_length_names_the_windows_chosen() -> None:
    """The kinds probe (2026-12-07): Schedule('lr', [0.1, 0.2], windows=3) was told only to
    change windows to 2, the opposite of what one who chose 3 windows wants."""
    with pytest.raises(ValueError, match=r"a value per window: 3 of them, or one for "
                                         r"every window; for 2 windows, Schedule\('lr', "
                                         r"init=\.\.\., windows=2\)"):
        hg.Schedule("lr", [0.1, 0.2], windows=3).init_raw(torch.float64)
