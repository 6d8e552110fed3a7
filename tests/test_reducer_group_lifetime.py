"""The recording groups lent to a DDP reducer outlive the reducer's use of them (see
``tracing.backward_collectives._keep_until_released``): freed from C++ after their Python
object, they aborted the process at exit. Checked here without processes: which groups
are kept, for how long."""

import gc

from torch import nn

from tracing import backward_collectives as bc


class _Group:  # stands in for a _ReducerGroup: only its identity matters here
    pass


def _kept_for(model) -> list:
    return [g for ref, g in bc._RECENT_GROUPS if ref() is model]


def test_the_two_newest_groups_of_each_model_are_kept_until_the_model_goes():
    saved = list(bc._RECENT_GROUPS)
    bc._RECENT_GROUPS.clear()
    try:
        a, b = nn.Linear(2, 2), nn.Linear(2, 2)
        ga = [_Group() for _ in range(3)]
        gb = _Group()
        bc._keep_until_released(a, ga[0])
        bc._keep_until_released(b, gb)
        bc._keep_until_released(a, ga[1])
        assert _kept_for(a) == ga[:2] and _kept_for(b) == [gb]
        bc._keep_until_released(a, ga[2])  # a backward ran since ga[0] was lent
        assert _kept_for(a) == ga[1:] and _kept_for(b) == [gb]
        del b
        gc.collect()
        bc._keep_until_released(a, _Group())  # the model (and its reducer) went first
        assert all(ref() is a for ref, _ in bc._RECENT_GROUPS)
        assert len(bc._RECENT_GROUPS) == 2
    finally:
        bc._RECENT_GROUPS[:] = saved
