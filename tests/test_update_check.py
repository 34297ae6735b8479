"""The engine's check of every incoming update (``fedlm.params.check_update``): an
update holding NaN or ±Inf anywhere is refused, naming its first such tensor, and no
finite update is refused, however large its values."""

import pytest
import torch

from fedlm.params import BadUpdate, check_update

REFERENCE = {"embed": torch.zeros(7, 5), "bias": torch.zeros(3), "empty": torch.zeros(0),
             "half": torch.zeros(4, dtype=torch.bfloat16), "count": torch.zeros(2, dtype=torch.int64)}


def update(**values) -> dict:
    """A copy of REFERENCE with ``name=(flat index, value)`` written in."""
    out = {k: v.clone() for k, v in REFERENCE.items()}
    for name, (index, value) in values.items():
        out[name].view(-1)[index] = value
    return out


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name,index", [("embed", 0), ("embed", 34), ("bias", 2), ("half", 3)])
def test_a_non_finite_value_anywhere_is_refused_by_name(name, index, value):
    with pytest.raises(BadUpdate, match=f"^{name}: holds NaN or Inf$"):
        check_update(update(**{name: (index, value)}), REFERENCE)


def test_the_first_non_finite_tensor_in_the_models_order_is_named():
    with pytest.raises(BadUpdate, match="^bias: "):
        check_update(update(half=(0, float("nan")), bias=(1, float("inf"))), REFERENCE)


@pytest.mark.parametrize("big", [torch.finfo(torch.float32).max, 3e38])
def test_the_largest_finite_values_pass(big):
    """Nothing is summed over a tensor's values, so no finite update can overflow
    into a false refusal."""
    check_update(update(embed=(0, big), bias=(0, -big), half=(1, torch.finfo(torch.bfloat16).max)),
                 REFERENCE)


def test_shape_and_dtype_are_checked_before_the_values():
    bad = update(bias=(0, float("nan")))
    bad["embed"] = torch.zeros(5, 7)
    with pytest.raises(BadUpdate, match=r"^embed: shape \(5, 7\), expected \(7, 5\)$"):
        check_update(bad, REFERENCE)
    bad["embed"] = torch.zeros(7, 5, dtype=torch.float64)
    with pytest.raises(BadUpdate, match="^embed: dtype torch.float64, expected torch.float32$"):
        check_update(bad, REFERENCE)
