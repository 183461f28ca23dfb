"""control/heap.py: the state is frozen out of the cycle collector's way,
and what was frozen by mistake is collected once in a while."""

import gc
import weakref

from llmgw.control import heap
from llmgw.control.config import ControlConfig


class _Node:
    pass


def test_what_settle_froze_is_left_alone_by_collections_until_reclaim():
    gc.collect()
    try:
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle: only the collector can free it
        gone = weakref.ref(a)
        heap.settle()
        assert gc.get_freeze_count() > 0
        del a, b
        gc.collect()
        assert gone() is not None, "a collection went over the frozen objects"
        heap.reclaim()
        assert gone() is None, "reclaim did not collect the garbage frozen by mistake"
        assert gc.get_freeze_count() > 0, "reclaim leaves what is alive frozen again"
    finally:
        gc.unfreeze()


def test_reclaim_is_a_setting_of_the_control_plane():
    assert ControlConfig().reclaim_every == 3600.0
    assert ControlConfig(reclaim_every=60.0).reclaim_every == 60.0
