import pytest

from fedlm.sim.clock import VirtualClock


def test_events_pop_in_time_order_with_fifo_ties():
    clock = VirtualClock()
    for at, name in [(3.0, "c"), (1.0, "a"), (2.0, "b1"), (2.0, "b2"), (2.0, "b3")]:
        clock.schedule(at, name)
    popped = [clock.pop() for _ in range(5)]
    assert popped == [(1.0, "a"), (2.0, "b1"), (2.0, "b2"), (2.0, "b3"), (3.0, "c")]
    assert clock.now == 3.0 and len(clock) == 0


def test_now_is_read_only_and_never_goes_back():
    clock = VirtualClock()
    clock.schedule(5.0, "x")
    clock.pop()
    with pytest.raises(AttributeError):
        clock.now = 0.0
    with pytest.raises(ValueError):
        clock.schedule(4.0, "past")
    assert clock.peek() is None
