"""`HostTurn` on CPU tensors: the copy path a device kind takes (`copies=True`), a model's
parameters and AdamW state through one reused host buffer, bit for bit; level 2's drop; storages
that cannot be resized left alone; on the CPU kind itself a kept turn moves nothing."""

import torch

import roll_device as rd
from strategies.host_turns import HostTurn

CPU = rd.get_platform("cpu")


def trained():
    """A small model after one AdamW step (the optimizer's state exists), its tensors, their copies."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Linear(48, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()
    tensors = list(model.parameters()) + [v for s in optimizer.state.values() for v in s.values()]
    return model, optimizer, tensors, [t.detach().clone() for t in tensors]


def test_turns_round_trip_bit_identical_through_one_reused_buffer():
    model, optimizer, tensors, before = trained()
    turn = HostTurn(CPU, copies=True)
    pointers = []
    for _ in range(3):
        released = turn.release(tensors)
        assert released == sum(t.untyped_storage().nbytes() for t in before)
        assert turn.holding and all(t.untyped_storage().nbytes() == 0 for t in tensors)
        turn.restore()
        assert all(torch.equal(a, b) for a, b in zip(tensors, before))
        pointers.append(turn.buffer.data_ptr())
    assert turn.allocations == 1 and len(set(pointers)) == 1
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()  # the optimizer's state is live tensors again after the round trips
    assert all(torch.isfinite(t).all() for t in tensors)


def test_the_buffer_grows_once_when_the_state_grows():
    model, _, tensors, _ = trained()
    turn = HostTurn(CPU, copies=True)
    params = list(model.parameters())
    turn.release(params)
    turn.restore()
    for _ in range(2):  # the optimizer's state joins: one larger buffer, then reuse
        turn.release(tensors)
        turn.restore()
    assert turn.allocations == 2 and turn.buffer.numel() >= sum(t.untyped_storage().nbytes() for t in tensors)


def test_level_two_drops_the_bytes_and_regrows_empty_storages():
    _, _, tensors, before = trained()
    turn = HostTurn(CPU, copies=True)
    turn.release(tensors, keep=False)
    turn.restore()
    assert turn.buffer is None and turn.allocations == 0
    assert [t.untyped_storage().nbytes() for t in tensors] == [t.untyped_storage().nbytes() for t in before]


def test_a_storage_that_cannot_be_resized_stays_where_it_is():
    mapped = torch.frombuffer(bytearray(range(64)), dtype=torch.uint8)  # as a checkpoint mapped in place
    turn = HostTurn(CPU, copies=True)
    assert turn.release([mapped]) == 0
    turn.restore()
    assert mapped.tolist() == list(range(64))


def test_on_the_host_kind_a_kept_turn_moves_nothing_and_a_dropped_one_frees():
    _, _, tensors, before = trained()
    turn = HostTurn(CPU)
    assert turn.release(tensors) == 0 and turn.holding
    turn.restore()
    assert turn.buffer is None and all(torch.equal(a, b) for a, b in zip(tensors, before))
    assert turn.release(tensors, keep=False) == sum(t.untyped_storage().nbytes() for t in before)
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors)
    turn.restore()
