"""FlashHead: a clustered output head for the draft model, so a draft step scores a few thousand rows
instead of the whole vocabulary (clean-room from the paper, arXiv 2603.14591; the authors' package has a
restrictive licence and is neither used nor copied).

Offline, the head's rows are grouped by equal-size spherical k-means into c clusters of `cluster_size`
tokens. At a draft step the hidden state scores the c (normalised) centroids, the top `n_probes` clusters
are opened, and exact logits are computed for their tokens plus always-scored special tokens; the argmax
over that subset is the draft token. The draft is therefore a greedy point mass whatever the temperature
(the paper's proposals are greedy) and verification is unchanged, so decoding stays lossless.

Assets use the released names: `<dir>/config.json` with `flash_head_cache_dir`, `n_probes` and
`flash_head_special_token_ids`, and `<dir>/<cache_dir>/clustering_cache.safetensors` holding `centroids`
[d, c] and `cluster_assignments` [V]. Released FlashHead model repos (embedl/*-FlashHead) carry the same
files next to the model weights, so they load as `--drafter sps=REPO` (the model) and are found there.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specbench_cli.core.method import DecodeState
from specbench_methods.checkpoints import CheckpointError, locate
from specbench_methods.sps import SpS

ASSET_FILE = "clustering_cache.safetensors"


@dataclass
class Clustering:
    centroids: torch.Tensor  # [d, c]
    assignments: torch.Tensor  # [V] cluster id per token
    special: list[int]
    n_probes: int

    def members(self) -> torch.Tensor:
        """[c, cap] token ids per cluster, padded with -1 (released clusters are all full)."""
        c = self.centroids.shape[1]
        order = torch.argsort(self.assignments, stable=True)
        sizes = torch.bincount(self.assignments, minlength=c)
        cap = int(sizes.max())
        slot = torch.arange(order.numel()) - torch.repeat_interleave(torch.cumsum(sizes, 0) - sizes, sizes)
        table = torch.full((c, cap), -1, dtype=torch.long)
        table[self.assignments[order], slot] = order
        return table


# ---------------------------------------------------------------------------------------------- building
def balanced_assign(rows: torch.Tensor, centroids: torch.Tensor, cap: int, candidates: int = 8) -> torch.Tensor:
    """Assign unit rows [V, d] to unit centroids [c, d] with at most `cap` rows per cluster.

    Rounds of proposals: every unassigned row proposes to its r-th most similar cluster, and each cluster
    takes its most similar proposers up to its remaining capacity. Rows left after `candidates` rounds fill
    the clusters that still have room, most similar first."""
    V, c = rows.shape[0], centroids.shape[0]
    m = min(candidates, c)
    tops = [(chunk @ centroids.T).topk(m, dim=1) for chunk in rows.split(8192)]  # never all V × c at once
    top_idx, top_sim = torch.cat([t.indices for t in tops]).cpu(), torch.cat([t.values for t in tops]).cpu()
    assign = torch.full((V,), -1, dtype=torch.long)
    room = torch.full((c,), cap, dtype=torch.long)
    for r in range(m):
        free = (assign < 0).nonzero()[:, 0]
        if free.numel() == 0:
            break
        want, sim = top_idx[free, r], top_sim[free, r]
        order = torch.argsort(sim, descending=True, stable=True)
        free, want = free[order], want[order]
        by_cluster = torch.argsort(want, stable=True)  # keeps similarity order inside each cluster
        free, want = free[by_cluster], want[by_cluster]
        counts = torch.bincount(want, minlength=c)
        rank = torch.arange(want.numel()) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        ok = rank < room[want]
        assign[free[ok]] = want[ok]
        room -= torch.bincount(want[ok], minlength=c)
    for i in (assign < 0).nonzero()[:, 0].tolist():
        open_clusters = (room > 0).nonzero()[:, 0]
        best = open_clusters[(centroids[open_clusters.to(centroids.device)] @ rows[i]).argmax().cpu()]
        assign[i] = best
        room[best] -= 1
    return assign


def build_clustering(head: torch.Tensor, cluster_size: int = 16, iterations: int = 8, seed: int = 0,
                     special: list[int] | None = None) -> Clustering:
    """Equal-size spherical k-means over the head's rows [V, d]: c = ceil(V / cluster_size) clusters."""
    rows = F.normalize(head.detach().float(), dim=1)  # on the head's device: a GPU builds in seconds
    V = rows.shape[0]
    c = -(-V // cluster_size)
    gen = torch.Generator().manual_seed(seed)
    centroids = rows[torch.randperm(V, generator=gen)[:c].to(rows.device)].clone()
    for _ in range(iterations):
        assign = balanced_assign(rows, centroids, cluster_size)
        sums = torch.zeros_like(centroids).index_add_(0, assign.to(rows.device), rows)
        centroids = F.normalize(sums, dim=1)
    return Clustering(centroids.T.contiguous().cpu(), assign, sorted(set(special or [])), max(1, c // 16))


def save_assets(clustering: Clustering, folder: Path, cache_dir: str = "flash_head_assets") -> Path:
    from safetensors.torch import save_file

    (folder / cache_dir).mkdir(parents=True, exist_ok=True)
    save_file({"centroids": clustering.centroids, "cluster_assignments": clustering.assignments},
              str(folder / cache_dir / ASSET_FILE))
    config = folder / "config.json"
    data = json.loads(config.read_text()) if config.exists() else {}
    data.update(flash_head_cache_dir=cache_dir, n_probes=clustering.n_probes,
                flash_head_special_token_ids=clustering.special)
    config.write_text(json.dumps(data, indent=2))
    return folder


def load_assets(folder: Path, vocab: int, hidden: int) -> Clustering | None:
    """Assets from a folder whose config.json names a flash_head_cache_dir; None when it names none."""
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    if "flash_head_cache_dir" not in config:
        return None
    from safetensors.torch import load_file

    path = folder / config["flash_head_cache_dir"] / ASSET_FILE
    if not path.exists():
        raise CheckpointError(f"{config_file}: flash_head_cache_dir points to {path}, which does not exist")
    tensors = load_file(str(path))
    for key in ("centroids", "cluster_assignments"):
        if key not in tensors:
            raise CheckpointError(f"{path}: missing tensor '{key}'")
    centroids = tensors["centroids"].squeeze().float()
    if centroids.dim() != 2 or centroids.shape[0] != hidden:
        raise CheckpointError(f"{path}: tensor 'centroids' has shape {'×'.join(map(str, centroids.shape))}, "
                              f"expected {hidden}×clusters")
    assign = tensors["cluster_assignments"].long().flatten()
    if assign.numel() != vocab or int(assign.max()) >= centroids.shape[1] or int(assign.min()) < 0:
        raise CheckpointError(f"{path}: tensor 'cluster_assignments' must give each of {vocab} tokens a cluster "
                              f"in 0..{centroids.shape[1] - 1}")
    c = centroids.shape[1]
    return Clustering(centroids, assign, [int(t) for t in config.get("flash_head_special_token_ids") or []],
                      int(config.get("n_probes") or max(1, c // 16)))


# ---------------------------------------------------------------------------------------------- the head
class FlashHeadLayer:
    """Scores only the rows of the probed clusters (and the special tokens)."""

    def __init__(self, weight: torch.Tensor, clustering: Clustering, n_probes: int) -> None:
        device = weight.device
        self.weight = weight
        self.centroids = F.normalize(clustering.centroids.to(device, weight.dtype), dim=0)  # [d, c]
        self.members = clustering.members().to(device)
        self.special = torch.tensor(clustering.special, dtype=torch.long, device=device)
        self.n_probes = min(n_probes, self.members.shape[0])

    def candidates(self, hidden: torch.Tensor) -> torch.Tensor:
        """Token ids scored for this hidden state: the probed clusters' members plus the special tokens."""
        probes = (hidden @ self.centroids).topk(self.n_probes).indices
        ids = self.members[probes].flatten()
        return torch.cat((ids[ids >= 0], self.special))

    def best(self, hidden: torch.Tensor) -> torch.Tensor:
        """The top token [B] of each row of hidden [B, H], on the device: every row probes its own clusters, so the
        rows score different candidates, but as many (n_probes clusters of `cap` slots and the special tokens): one
        gather of [B, candidates] head rows and one batched product, empty slots (-1) never chosen. A fixed shape
        whatever the clusters hold (no host read to learn it), and the same candidates in the same order as
        `candidates` lists, so equal scores pick the same token at every batch size."""
        probes = (hidden @ self.centroids).topk(self.n_probes).indices  # [B, n_probes]
        ids = torch.cat((self.members[probes].flatten(1), self.special.expand(hidden.shape[0], -1)), 1)
        scores = (self.weight[ids.clamp(min=0)] @ hidden[:, :, None])[..., 0]  # [B, candidates]
        best = scores.masked_fill(ids < 0, float("-inf")).argmax(-1, keepdim=True)
        return ids.gather(1, best)[:, 0]


class FlashHead(SpS):
    name = "flashhead"
    optional_drafters = ("flashhead",)  # a folder with FlashHead assets; else the sps model's, else built

    @dataclass
    class Options(SpS.Options):
        n_probes: int = 0  # 0 = the assets' n_probes (the released default is clusters / 16)
        cluster_size: int = 16  # tokens per cluster when assets are built (the paper's README example)
        RANGES = {**SpS.Options.RANGES, "n_probes": (0, None), "cluster_size": (1, None)}
        DEFAULT_TEXT = {"n_probes": "from the assets"}

    def __init__(self, options: Options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        weight = self.draft.get_output_embeddings().weight[: self.vocab]
        clustering = self._assets(weight)
        self.flash = FlashHeadLayer(weight, clustering, options.n_probes or clustering.n_probes)

    def _assets(self, weight: torch.Tensor) -> Clustering:
        vocab, hidden = weight.shape
        for ref in (self.given_drafter("flashhead"), self.drafter_ref("sps")):
            if ref:
                found = load_assets(locate(ref, "flashhead"), vocab, hidden)
                if found is not None:
                    return found
        return self._built(weight)

    def _built(self, weight: torch.Tensor) -> Clustering:
        """Build (once; cached by head content) the clustering of this draft model's head."""
        digest = hashlib.sha256(weight.detach().float().cpu().numpy().tobytes()).hexdigest()[:16]
        folder = Path(self.model.cache_dir) / "flashhead" / f"{digest}-c{self.options.cluster_size}"
        cached = load_assets(folder, *weight.shape) if (folder / "config.json").exists() else None
        if cached is not None:
            return cached
        special = sorted(getattr(self.model, "stop_ids", ()) or ())
        clustering = build_clustering(weight, self.options.cluster_size, special=special)
        save_assets(clustering, folder)
        return clustering

    def head(self, hidden: torch.Tensor, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.greedy(hidden[None]), None  # greedy point mass at every temperature

    def heads(self, hidden: torch.Tensor, states: list[DecodeState]) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        return self.greedy(hidden), [None] * len(states)

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """The clustered head's top token [B] of each row of hidden [B, H]; compiled, a graph of its own."""
        return self.run_step("flash head", self.flash.best, hidden)

    @torch.inference_mode()
    def head_probes(self, target, prompt_ids: list[int]) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
        """What `profile --component head` times (FlashHead thesis Tables 4.1-4.4), per head (dense, FlashHead):
        the head alone on the prompt's last hidden state, and a whole draft step (the prompt's last token through
        the draft body again, then the head)."""
        state = DecodeState(list(prompt_ids), len(prompt_ids), target, 0.0, None)
        self.start(state)
        hidden = self.feed(list(prompt_ids), state)
        length = len(self.lane(state).cached)
        heads = {"dense": lambda h: SpS.greedy(self, h[None]), "FlashHead": lambda h: self.greedy(h[None])}

        def step(head) -> None:
            self.truncate(state, length)  # forget the previous repetition's token
            head(self.feed([prompt_ids[-1]], state))

        return {variant: (functools.partial(head, hidden), functools.partial(step, head))
                for variant, head in heads.items()}
