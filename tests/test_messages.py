"""The ServerApp <-> ClientApp messages: what one side writes, the other reads back whole."""

from collections import OrderedDict

import torch

from fedlm.flower import messages
from fedlm.job import JobResult, JobSpec


def test_a_train_request_reads_back_as_sent():
    job = JobSpec(job_id=7, worker=2, base_version=5, local_steps=20, data_seed=123456789,
                  prev_job=3, keep_from=1, fault="nan", shard=1, cursor=40, schedule_step=60)
    params = OrderedDict(a=torch.randn(3, 4), b=torch.arange(5, dtype=torch.float32))
    got = messages.read_train_request(messages.train_request(job, params, '{"x": 1}', "key"))
    assert got.job == job
    assert got.cfg_json == '{"x": 1}' and got.run_key == "key"
    assert list(got.params) == ["a", "b"]
    assert all(torch.equal(got.params[k], params[k]) for k in params)


def test_a_train_reply_reads_back_as_sent():
    grad = OrderedDict(w=torch.randn(2, 3).t())  # not contiguous: the reply makes it so
    sent = JobResult(9, grad, steps=20, tokens=5120, train_loss=2.5, compute_seconds=0.25)
    content = messages.train_reply(sent, batch_size=8)
    got = messages.read_train_reply(content, job_id=9)
    assert (got.job_id, got.steps, got.tokens, got.train_loss, got.compute_seconds) == \
        (9, 20, 5120, 2.5, 0.25)
    assert torch.equal(got.outer_grad["w"], grad["w"])
    assert content["metrics"]["num-examples"] == 160  # what Flower's own tools read


def test_the_partition_query_carries_the_config_and_the_answer_the_partition():
    assert messages.query_config(messages.partition_query('{"y": 2}')) == '{"y": 2}'
    assert messages.read_partition_answer(messages.partition_answer(3, 4)) == (3, 4)


def test_tensors_travel_as_one_packed_array_bit_for_bit():
    tensors = OrderedDict(f=torch.randn(3, 4), h=torch.randn(5).to(torch.bfloat16),
                          q=torch.randint(-128, 127, (7,), dtype=torch.int8),
                          s=torch.tensor(2.5), e=torch.zeros(0, 3), n=torch.tensor([float("nan")]))
    record = messages.pack(tensors)
    assert len(record["packed"].data) == sum(t.numel() * t.element_size()
                                             for t in tensors.values())
    got = messages.unpack(record)
    assert list(got) == list(tensors)
    for k, t in tensors.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape
        assert got[k].view(-1).view(torch.uint8).tolist() == \
            t.reshape(-1).view(torch.uint8).tolist() if t.numel() else got[k].numel() == 0
