"""The host's reads of device values inside a round, and its blocking uploads (`core.host_reads`): what a round would
synchronise on a GPU.

The counter itself on planted reads, then every method's round on the embedded model, pinned: a change that adds a
read, or removes one, must update the table here and ARCHITECTURE.md's (the goal is one a round: the accepted length)."""

from __future__ import annotations

import collections

import pytest
import torch

from specbench_cli.core.host_copy import to_host
from specbench_cli.core.host_reads import HostReads, per_round
from tests.conftest import needs_embedded


def test_reads_of_device_values_are_counted_and_host_values_are_not():
    weight = torch.randn(4, 4)
    with HostReads([weight]) as reads:
        x = weight @ torch.ones(4)  # a device value (reads a root)
        x.sum().item()
        x.tolist()
        bool(x[0] > 0)
        int(x.argmax())
        x[x > 0]  # its shape depends on the values
        host = torch.tensor([1, 2, 3])  # the host's own
        host.tolist()
        int(host[0])
        on_device = torch.arange(3, device=weight.device)  # told a device: would live there
        on_device.tolist()
        copied = x.cpu()  # one read; the copy is a host value
        copied.tolist()
        x.shape  # metadata: no read
    assert reads.count == 7
    assert {site.split()[0] for site in reads.sites} == {"item", "tolist", "__bool__", "__int__", "__getitem__", "cpu"}
    assert all("tests/test_host_reads.py" in site for site in reads.sites), reads.sites  # where the read was written


def test_blocking_uploads_are_counted_and_asynchronous_ones_are_not():
    from specbench_cli.core.host_copy import to_device

    weight, cpu = torch.randn(4, 4), torch.device("cpu")
    with HostReads([weight]) as reads:
        torch.tensor([1, 2], device=cpu)  # from pageable memory: a blocking copy on CUDA
        torch.tensor([3]).to(cpu)
        weight[0] = torch.zeros(4)  # a host value written into a device tensor
        weight[torch.tensor([1, 2])]  # a host index tensor
        to_device([1, 2], cpu)  # through pinned memory, asynchronous
        to_device(weight, cpu)  # there already
        torch.tensor([], device=cpu)  # nothing to copy
        weight[1] = 0.0  # a Python number rides in the kernel's arguments
        assert reads.count == 0
    assert sorted(site.split()[0] for site in reads.uploads) == ["__getitem__", "__setitem__", "tensor", "to"], \
        reads.uploads


def test_to_host_is_one_read_and_exact():
    weight = torch.randn(3)
    with HostReads([weight]) as reads:
        scores = torch.log_softmax(weight * 1e-3, -1)
        ids = (weight * 1e6).long().abs() + 2**40  # integers far past float32's exact range
        half = weight.to(torch.bfloat16)
        out = to_host(scores, ids, half, weight > 0)
    assert reads.count == 1
    assert [o.dtype for o in out] == [torch.float32, torch.int64, torch.bfloat16, torch.bool]
    assert all(torch.equal(o, t) for o, t in zip(out, (scores, ids, half, weight > 0)))


# Host reads of device values in every round at the default options (the embedded model's drafters): the accepted
# length (core/acceptance.py), plus each method's own (ARCHITECTURE.md says what each is).
READS_A_ROUND = {"baseline": 1, "suffix": 1, "pld": 1, "eagle3": 1, "dflash": 1, "dart": 2, "confu": 1, "sps": 1,
                 "flashhead": 1, "whiflash-entropy": 1, "whiflash-neural": 1, "hvd": 1, "hvd-freq": 1}


@pytest.mark.slow
@needs_embedded
def test_every_methods_round_reads_the_device_as_often_as_the_table_says(embedded):
    from benchmarks.gpu.sync_check import method_rounds

    prompt = embedded.encode_chat([{"role": "user", "content": "Write a short story about a robot who paints."}])
    measured, where, uploads = {}, {}, collections.Counter()
    for name in READS_A_ROUND:
        rounds = method_rounds(name, embedded, prompt, 24)
        measured[name] = max(r.reads for r in rounds)
        where[name] = sorted(sum((r.sites for r in rounds), collections.Counter()))
        uploads += sum((r.uploads for r in rounds), collections.Counter())
    assert measured == READS_A_ROUND, where
    # and no round copies host values to the device the blocking way (`core.host_copy.to_device` does it)
    assert not uploads, uploads


@pytest.mark.slow
@needs_embedded
@pytest.mark.parametrize("name", ["baseline", "eagle3", "dflash"])
def test_a_batchs_round_reads_the_device_once_for_every_sequence(embedded, name):
    """Two lanes over three turns: every round, refills between them included, reads the device once for all its
    sequences (their argmaxes and trees together) and uploads nothing the blocking way."""
    from specbench_cli.core.engine import Turn, decode
    from specbench_cli.core.method import networks
    from specbench_cli.core.target import TargetModel
    from specbench_cli.core.turn import DecodeSettings
    from specbench_cli.models import get_model_spec
    from specbench_cli.registry import method_class

    cls = method_class(name)
    method = cls(cls.Options(), embedded, get_model_spec("smollm2-135m").drafters)
    todo = [Turn(embedded.encode_chat([{"role": "user", "content": c}]))
            for c in ("Write a short story about a robot who paints.", "List three uses of copper.", "Explain rain.")]
    reads = HostReads([t for m in (embedded.model, *networks(method)) for t in (*m.parameters(), *m.buffers())])
    with reads, per_round(reads, embedded.device) as rounds:
        decode(TargetModel(embedded.model, embedded.device, slots=2), method, 2, DecodeSettings(24, 0.0, frozenset()),
               lambda lane, finished: todo.pop() if todo else None)
    assert [r.reads for r in rounds] == [1] * len(rounds), [r.sites for r in rounds if r.reads != 1]
    assert not sum((r.uploads for r in rounds), collections.Counter())
