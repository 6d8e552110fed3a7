"""torch's own layers, read against their documented parameter shapes (tracing.dims.contracts).

A contract is kept only where it agrees with the parameter torch built, so a layer whose
every parameter has one is a layer whose documentation the module matches at these sizes:
the shapes torch makes are the reference.
"""

import pytest
import torch.nn as nn

from tracing.dims.contracts import layer_contracts


@pytest.mark.parametrize(
    "layer",
    [
        nn.LSTM(24, 40, 2),
        nn.LSTM(24, 40, 3, proj_size=8, bidirectional=True, batch_first=True),
        nn.GRU(24, 40, 2, bidirectional=True),
        nn.RNN(24, 40, 2, nonlinearity="relu", bias=False),
        nn.MultiheadAttention(48, 4),
        nn.MultiheadAttention(48, 4, kdim=20, vdim=28, add_bias_kv=True),
    ],
    ids=["lstm", "lstm-proj-bidirectional", "gru-bidirectional", "rnn-relu", "mha", "mha-kv"],
)
def test_every_parameter_of_a_torch_layer_has_a_contract_that_matches_its_shape(layer):
    contracts = layer_contracts(layer)
    params = dict(layer.named_parameters(recurse=False))
    assert set(contracts) == set(params)
    for name, axes in contracts.items():
        sized = [c.times * c.size if c else n for c, n in zip(axes, params[name].shape)]
        assert tuple(sized) == tuple(params[name].shape)


def test_the_axes_read_what_the_documentation_says():
    lstm = layer_contracts(nn.Sequential(nn.LSTM(24, 40, 2, proj_size=8)))
    assert [(c.attr, c.times) for c in lstm["0.weight_ih_l0"]] == [
        ("hidden_size", 4),
        ("input_size", 1),
    ]
    assert [c.attr for c in lstm["0.weight_hh_l1"]] == ["hidden_size", "proj_size"]
    assert [c.attr for c in lstm["0.weight_ih_l1"]] == ["hidden_size", "proj_size"]
    assert [c.attr for c in lstm["0.weight_hr_l0"]] == ["proj_size", "hidden_size"]
    mha = layer_contracts(nn.MultiheadAttention(48, 4, kdim=20, vdim=28))
    assert [c.attr for c in mha["k_proj_weight"]] == ["embed_dim", "kdim"]


def test_a_layer_that_no_longer_matches_its_documentation_gets_no_contract():
    lstm = nn.LSTM(24, 40)
    lstm.hidden_size = 41  # changed after it was built: its weights still say 40
    assert layer_contracts(lstm) == {}
