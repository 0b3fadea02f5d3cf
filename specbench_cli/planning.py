"""A run's plan: the checks that need the method's code or torch (its options and drafters, the device and
dtype, a tuned budget, what the engine adds), the fit of every prompt in the model's context, and the drafter
weights a run records. `inputs.check_run` has made every check that needs neither; no model loads here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import torch

from specbench_methods.checkpoints import weights_id
from specbench_cli.core.errors import UsageError
from specbench_cli.core.kernels import PACKED_DTYPES, packs
from specbench_cli.core.method import Method, OwnLoop
from specbench_cli.options import parse_options
from specbench_cli.datasets import Prompt
from specbench_cli.greedy_replay import replays
from specbench_cli.inputs import Plan, RunConfig, check_run
from specbench_cli.loading import (LoadedModel, load_model, resolve_device, resolve_dtype, resolve_invariant,
                                   target_weights)
from specbench_cli.models import ModelSpec, checkpoint_ref, family, random_sps_draft
from specbench_cli.random_weights import RANDOM_DRAFTERS, drafter_seed, is_random_drafter
from specbench_cli.registry import engine_entry, method_class, plan_for_engine
from specbench_cli.budgets import cpu_budget, machine_key, tuned_opts

TEMPLATE_MARGIN = 64  # chat-template tokens per turn beyond the joined turns' (role headers, end-of-turn)


def plan(config: RunConfig, env: dict[str, str], chosen: Plan | None = None, cpu_bf16: bool = True) -> Plan:
    """`check_run`'s checks (unless the caller ran them: `chosen`), then those that need the method's code or
    torch; no model loads here. `cpu_bf16=False`: `--dtype auto` stays float32 on the CPU (`resolve_dtype`)."""
    chosen = chosen or check_run(config, env)
    cls = method_class(config.method)
    notes: list[str] = []
    options = parse_options(cls, config.opts, notes)
    drafters = _parse_drafters(config.drafters, cls, chosen.spec)
    for name in cls.drafter_names:
        drafter_ref(cls, chosen.spec, drafters, name)  # a missing drafter is reported before anything loads
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device, cpu_bf16)
    mode = ("reduce-overhead" if device.type == "cuda" else "inductor") if config.compile else None
    ours = engine_entry(config.engine).our_target  # batch invariance and prepacked weights are our target's
    invariant = ours and resolve_invariant(config.batch_invariant, mode is not None, device, dtype.dtype)
    options, chosen, tuned_from, budget_from = _budget(config, chosen, options, device, dtype.dtype, invariant, notes)
    planned = dataclasses.replace(chosen, method_cls=cls, options=options, drafters=drafters, device=device,
                                  dtype=dtype.dtype, dtype_reason=dtype.reason, tuned_from=tuned_from,
                                  cpu_budget_from=budget_from,
                                  compile_mode=mode, batch_invariant=invariant, notes=notes,
                                  prepacked=ours and packs(device, dtype.dtype, mode is not None, invariant))
    if planned.tuned_from:
        check_tuned_weights(planned)
    if chosen.acceptance is not None and not cls.drafts:
        raise UsageError(f"--acceptance replaces the accept decision on a draft; {config.method} never drafts")
    if config.batch_size > 1 and issubclass(cls, OwnLoop):
        raise UsageError(f"{config.method} runs its own loop, one sequence at a time; --batch-size > 1 runs every "
                         "other method")
    return plan_for_engine(planned)


def _budget(config: RunConfig, chosen: Plan, options: object, device: torch.device, dtype: torch.dtype,
            invariant: bool, notes: list[str]) -> tuple[object, Plan, str, str]:
    """The draft budget: `tune`'s (--tuned) under any --opt, else the CPU budget `run` drafts where one is recorded
    (`budgets.cpu_budget`), else the paper's under any --opt (`options` as parsed). Returns the options, the plan
    (with vLLM's per-batch-size table where the tune chose one), and the tune and CPU-budget records applied."""
    cls, ours = method_class(config.method), engine_entry(config.engine).our_target
    if config.tuned:  # the tuned budget first, so that an explicit --opt still wins
        machine = machine_key(dtype, device, torch.get_num_threads(), invariant, config.engine)
        tuned = tuned_opts(chosen.spec.name, config.method, machine, max(config.batch_size, config.concurrency))
        notes.append(f"tuned budget {' '.join(tuned.opts) or '(the paper default)'} from {tuned.path}"
                     + (f", vLLM's K per batch size {tuned.schedule}" if tuned.schedule and chosen.engine is not None
                        else ""))
        if tuned.schedule and chosen.engine is not None:
            chosen = dataclasses.replace(chosen, engine=dataclasses.replace(chosen.engine, schedule=tuned.schedule))
        return parse_options(cls, [*tuned.opts, *config.opts], notes), chosen, str(tuned.path), ""
    cpu = cpu_budget(config.method, device, ours, config.opts) if config.cpu_budget else None
    if cpu is None:
        return options, chosen, "", ""
    notes.append(f"{config.method} drafts its CPU budget {' '.join(cpu.opts)} ({cpu.record}); "
                 "--paper-budget drafts the paper's")
    return parse_options(cls, list(cpu.opts), notes), chosen, "", cpu.record


def one_weight_copy(plans: list[Plan]) -> bool:
    """Whether runs sharing one loaded target can free its plain weights once it has packed them (one copy of
    each weight, not two: what lets an 8 B bf16 target fit a 24 GiB machine): every run packs its target, no
    method reads the target's weights itself (`Method.reads_target_weights`: `generate()`, SpS's draft model that
    copies the target's head), and none replays on a target that reads the plain weights (a float32 replay's
    batch-invariant target does not pack; a half-precision one packs alike)."""
    return all(p.prepacked and not p.method_cls.reads_target_weights
               and (p.dtype in PACKED_DTYPES or not replays(p.config)) for p in plans)


def _parse_drafters(pairs: list[str], cls: type, spec: ModelSpec) -> dict[str, str]:
    drafters = {}
    accepted = (*cls.drafter_names, *cls.optional_drafters)
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"malformed --drafter '{pair}': expected NAME=PATH")
        if name not in accepted:
            raise UsageError(f"method {cls.name} has no drafter '{name}'" + (f" (it takes: {', '.join(accepted)})" if accepted else ""))
        if is_random_drafter(path) and name not in RANDOM_DRAFTERS:
            raise UsageError(f"--drafter {pair}: random weights are built for {', '.join(RANDOM_DRAFTERS)} only")
        if is_random_drafter(path) and name == "sps" and random_sps_draft(family(spec)) is None:
            raise UsageError(f"--drafter {pair}: a random SpS drafter is built beside Qwen3 and Llama-3.1 targets only "
                             f"(the shapes of their registered drafters), not beside {spec.name}")
        drafters[name] = path if is_random_drafter(path) else checkpoint_ref(path, "drafter")
    return drafters


def tokens_needed(plan: Plan, model: LoadedModel, prompt: Prompt) -> int:
    """An upper bound on the positions a prompt fills: all its turns (chat template applied) plus, per turn,
    an answer of --max-new-tokens and the template's own tokens."""
    turns = len(model.encode_chat([{"role": "user", "content": "\n".join(prompt.turns)}]))
    return turns + len(prompt.turns) * (plan.config.max_new_tokens + TEMPLATE_MARGIN)


def check_lengths(plan: Plan, model: LoadedModel, context: int | None) -> int:
    """The stated rule for prompts that do not fit: a prompt whose `tokens_needed` exceeds the model's context
    (max_position_embeddings) is refused before anything decodes; nothing is truncated. Returns the most
    positions any selected prompt needs (what a compiled cache is sized for)."""
    longest = 0
    for prompt in (*plan.warmup, *plan.prompts):
        need = tokens_needed(plan, model, prompt)
        longest = max(longest, need)
        if context is not None and need > context:
            raise UsageError(f"prompt '{prompt.id}' needs up to {need} positions ({len(prompt.turns)} turn(s) plus "
                             f"--max-new-tokens {plan.config.max_new_tokens} each) but {plan.spec.name}'s "
                             f"context is {context}; lower --max-new-tokens, or leave the prompt out")
    return longest


def drafter_weights(plan: Plan) -> dict[str, str]:
    """Which weights each drafter the method loads has (`checkpoints.weights_id`: a local folder's fingerprint, a
    calibration's with its config.json, whose thresholds decide, or a hub id with its commit). Optional drafters
    count when passed or registered (DART's trie, whiflash-entropy's thresholds unless `--opt threshold` stands in
    for them). Recorded in run.json so that two runs with other drafter weights under the same settings (a
    retrained drafter or a recalibrated router at the registered path, a hub repo that moved on) never merge into
    one report row, and a resume cannot mix them."""
    cls = plan.method_cls
    unread = set() if cls.reads_calibration(plan.options) else {cls.calibration}
    optional = [n for n in cls.optional_drafters if (n in plan.drafters or n in plan.spec.drafters) and n not in unread]
    refs = {name: drafter_ref(cls, plan.spec, plan.drafters, name) for name in [*cls.drafter_names, *optional]}
    once = functools.cache(weights_id)  # DART's draft and trie often share one folder: read it once
    return {name: f"{ref} (seed {drafter_seed(ref, plan.spec.target)})" if is_random_drafter(ref) else
            once(ref, ("config.json",) if name == cls.calibration else ()) for name, ref in refs.items()}


def checkpoint_weights(plan: Plan) -> dict[str, str]:
    """The weights a measurement holds for: the target's (`loading.target_weights`) and its method's drafters'."""
    return {"target": target_weights(plan.spec), **drafter_weights(plan)}


def method_weights(base: Plan, config: RunConfig) -> dict[str, str]:
    """`checkpoint_weights` of `config`'s method on `base`'s model (a tune, whose plans at hand are the baseline's)."""
    cls = method_class(config.method)
    planned = dataclasses.replace(base, method_cls=cls, options=cls.Options(),
                                  drafters=_parse_drafters(config.drafters, cls, base.spec))
    return checkpoint_weights(planned)


def check_tuned_weights(planned: Plan) -> None:
    """`run --tuned` on other weights than the tune measured (a hub repo moved, a retrained drafter): one line,
    since the budget was chosen for those. A record written before weights were recorded is not judged."""
    recorded = json.loads(Path(planned.tuned_from).read_text()).get("weights") or {}
    now = checkpoint_weights(planned) if recorded else {}
    changed = sorted(n for n in {*recorded, *now} if recorded.get(n) != now.get(n))
    if changed:
        raise UsageError(f"the tuned budget {planned.tuned_from} was measured with other {', '.join(changed)} weights "
                         f"than this run loads; re-run `specbench tune --method {planned.config.method} --model "
                         f"{planned.spec.name}` for these")


def loaded_target(plan: Plan, model: LoadedModel | None, split: bool = False) -> LoadedModel:
    """The target, loaded now unless a caller (calibrate, which runs several records on one target) has it."""
    if model is not None and (model.dtype, model.device.type) != (plan.dtype, plan.device.type):
        raise RuntimeError(f"a {model.dtype} target on {model.device} handed to a {plan.dtype} run on {plan.device}")
    return model if model is not None else load_model(plan.spec, plan.device, plan.dtype, split)


def drafter_ref(cls: type[Method], spec, overrides: dict[str, str], name: str) -> str:
    """The checkpoint of drafter `name` for a run of method `cls` on model `spec`: the run's --drafter first, then
    the model registry's; a missing one in one line that says why it is missing and how to make it."""
    if name in overrides:
        return overrides[name]
    if name in spec.drafters:
        return spec.drafters[name]
    missing = spec.missing_drafters.get(name) or cls.how_to_make.get(name, "").format(model=spec.name)
    why = f" ({missing})" if missing else ""
    raise UsageError(f"no {name} drafter is registered for model {spec.name}{why}; pass --drafter {name}=PATH_OR_HUB_ID")
