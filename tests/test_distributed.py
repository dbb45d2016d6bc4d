"""DistributedDataParallel: a tiny RoI head trained on 2 CPU processes (gloo) ends with
the same gradients and parameters as one process trained on the union of the data."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import roiops

WORLD = 2
STEPS = 3
IMAGES_PER_RANK = 2
BOXES_PER_IMAGE = 6  # equal everywhere, so the mean of the ranks' mean losses is the global mean


class _RoIHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU())
        self.classifier = torch.nn.Linear(8 * 4 * 4, 3)

    def forward(self, images: torch.Tensor, boxes: list[torch.Tensor]) -> torch.Tensor:
        features = self.backbone(images)  # stride 2
        pooled = roiops.roi_align(features, boxes, 4, spatial_scale=0.5, sampling_ratio=2, aligned=True)
        return self.classifier(pooled.flatten(1))


def _data(step: int) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """The whole batch of one step: images, per-image boxes and one label per box."""
    g = torch.Generator().manual_seed(1000 + step)
    n = WORLD * IMAGES_PER_RANK
    images = torch.randn(n, 3, 24, 32, generator=g)
    boxes = []
    for _ in range(n):
        xy = torch.rand(BOXES_PER_IMAGE, 2, generator=g) * torch.tensor([28.0, 20.0]) - 2
        wh = torch.rand(BOXES_PER_IMAGE, 2, generator=g) * 14 + 0.5
        boxes.append(torch.cat([xy, xy + wh], dim=1))
    labels = torch.randint(0, 3, (n * BOXES_PER_IMAGE,), generator=g)
    return images, boxes, labels


def _train(model: torch.nn.Module, rank: int | None) -> list[list[torch.Tensor]]:
    """SGD steps on the whole batch (rank None) or on this rank's share; the gradients of each step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    grads = []
    for step in range(STEPS):
        images, boxes, labels = _data(step)
        if rank is not None:
            lo, hi = rank * IMAGES_PER_RANK, (rank + 1) * IMAGES_PER_RANK
            images, boxes = images[lo:hi], boxes[lo:hi]
            labels = labels[lo * BOXES_PER_IMAGE:hi * BOXES_PER_IMAGE]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(images, boxes), labels).backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        opt.step()
    return grads


def _worker(rank: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    # A file store: no port to race for, and no store server that one rank's exit takes away.
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out_dir, 'rendezvous')}", rank=rank,
                            world_size=WORLD)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(_RoIHead())
        grads = _train(model, rank)
        params = [p.detach().clone() for p in model.module.parameters()]
        torch.save({"grads": grads, "params": params}, os.path.join(out_dir, f"rank{rank}.pt"))
        # Tear down only once both ranks are done, and without the model's reducer still
        # holding the group: a gloo thread torn down mid-work aborts the process.
        del model
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
def test_ddp_two_processes_equals_single_process(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=WORLD, join=True)

    torch.manual_seed(0)
    single = _RoIHead()
    expected_grads = _train(single, None)
    expected_params = list(single.parameters())
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for step, (gs, es) in enumerate(zip(got["grads"], expected_grads)):
            for g, e in zip(gs, es):
                torch.testing.assert_close(g, e, rtol=0, atol=1e-6, msg=f"rank {rank} step {step} gradient")
        for p, e in zip(got["params"], expected_params):
            torch.testing.assert_close(p, e.detach(), rtol=0, atol=1e-6, msg=f"rank {rank} parameters")
