"""What `specbench train-drafter` does: check the settings, build (or grow, or resume) the self-distillation
corpus from the target's own answers, and train the method's drafter on it, with a progress bar."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console


def train(console: Console, err_console: Console, *, method: str, model: str, out: Path | None,
            corpus: Path | None, prompts: int | None, max_new_tokens: int, batch_size: int, steps: int,
            eval_every: int, minutes: float, lr: float, anneal: int, opt: list[str] | None, flags: dict,
            init: str | None, seed: int, resume: bool, threads: int | None, device: str) -> None:
    """The checks come first (an unknown method, a bad number, a bad --opt: one line before anything loads);
    `flags` are the deprecated shape options (name -> value or None)."""
    from specbench_cli.inputs import at_least, use_threads
    from specbench_cli.models import drafter_folder, get_model_spec
    from specbench_cli.registry import corpus_layers, recipe_class
    from specbench_cli.commands.train.inputs import TrainSettings, init_checkpoint, train_settings, training_folder

    recipe = recipe_class(method)  # an unknown method fails here, before anything loads
    spec = get_model_spec(model)
    for option, value, low in (("--threads", threads, 1), ("--prompts", prompts, 1), ("--steps", steps, 1),
                               ("--max-new-tokens", max_new_tokens, 1), ("--batch-size", batch_size, 1),
                               ("--minutes", minutes, 0), ("--eval-every", eval_every, 1), ("--anneal", anneal, 0)):
        at_least(option, value, low)
    notes = [f"note: --{k.replace('_', '-')} is deprecated and will be removed in the next release; write --opt "
             f"{method}.{k}={v}" for k, v in flags.items() if v is not None]
    settings = train_settings(TrainSettings(method=method, steps=steps, lr=lr, seed=seed, minutes=minutes,
                                            eval_every=eval_every, anneal=anneal, init=init_checkpoint(init, method, spec)),
                              [*(f"{method}.{k}={v}" for k, v in flags.items() if v is not None), *(opt or [])])
    for line in notes:
        err_console.print(line, highlight=False, soft_wrap=True)
    out = training_folder(out or drafter_folder(model, method), resume)
    import torch

    from specbench_cli.loading import load_model, resolve_device
    from specbench_cli.models import cache_root
    from specbench_cli.progress import progress_bar
    from specbench_cli.commands.train import distill
    from specbench_cli.commands.train.train import command_line, train

    use_threads(threads)
    # Gradients that travel back through a frozen target (ConFu) become denormal floats, which x86 CPUs
    # handle ~10x slower; flushing them to zero changes nothing a drafter learns.
    torch.set_flush_denormal(True)
    loaded = load_model(spec, resolve_device(device), torch.float32)
    folder = corpus or cache_root() / "distill" / model
    layers = corpus_layers(loaded.model.config.num_hidden_layers)  # one corpus serves every recipe
    with progress_bar(console) as bar:
        data = distill.prepare(loaded, folder, layers, prompts, max_new_tokens, batch_size, seed, recipe.needs_topk, bar)
        task = bar.add_task(f"training {method}", total=steps, stats="")

        def progress(step: int, loss: float, acc) -> None:
            stats = f"loss {loss:.3f}" + (f"  held-out top-1 {' '.join(f'{a:.2f}' for a in acc)}" if acc else "")
            bar.update(task, completed=step, stats=stats)

        card = train(loaded.model, data, out, settings, command_line(), progress, resume)
    console.print(f"wrote {out} ({card['wall_seconds']:.0f} s, {data.tokens} corpus tokens); "
                  f"held-out top-1 per position: {card['heldout_top1_per_position']}")
