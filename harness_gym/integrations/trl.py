"""TRL's `GRPOTrainer` on harness episodes: a `rollout_func` that runs real coding-agent CLIs.

    >>> from harness_gym.integrations.trl import harness_reward, make_rollout_func, task_dataset
    >>> rollout = make_rollout_func(harness="pi", tasks="builtin", context_overflow="truncate")
    >>> rollout.config.context_overflow, len(task_dataset("builtin")) == len(rollout.tasks)
    ('truncate', True)

Then, with a model and its tokenizer (tests/test_trl_integration.py trains the tiny model)::

    from trl import GRPOConfig, GRPOTrainer
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(...),
                          train_dataset=task_dataset("builtin"), reward_funcs=harness_reward,
                          rollout_func=rollout)
    trainer.train(); rollout.close()

The contract (TRL 1.16, `GRPOTrainer._generate`): TRL calls `rollout_func(prompts, trainer)` with
the prompts of one generation batch, each prompt already repeated `num_generations` times in a
row (its `RepeatSampler`), and wants one row per prompt back: `prompt_ids`, `completion_ids`,
`logprobs` (one float per completion token), optionally `env_mask` (1 = the model's tokens,
0 = tokens the environment inserted; TRL multiplies it into the loss mask). Every other key is a
list with one value per row, copied onto the dataset rows and passed to the reward functions as a
keyword argument: here `reward`, `outcome`, `task_id`, `n_tool_calls`, `policy_version`,
`n_segments`.

Prompts select tasks. `rollout_func` sees only the prompt column, so a prompt (a string, or a
conversation whose last user message is used) must be a task's `instance_id` or its problem
statement, or contain an `instance_id`; `task_dataset()` builds such a dataset. The harness itself
is always given the task's own problem statement.

One row per rollout, and a rollout is several trace segments when the CLI rewrote its history
(compaction, a sub-agent): concatenating them is impossible, because each segment is its own token
sequence with its own prompt, not a continuation of the previous one. The row is the `agent`
segment with the most sampled tokens (`loss_mask` 1); the other segments are left out of the
loss (`n_segments` says how many there were). A rollout with no agent segment (the CLI failed
before its first call, an infra error) becomes a one-token placeholder with `env_mask` 0, so it
still has its reward (for the group's baseline) and adds nothing to the gradient.
That limit is `GRPOTrainer`'s contract (one row per prompt); the asynchronous path
(`integrations/async_grpo.py`, one sample per segment) has none.

Where the policy runs:

- `engine=None` (the CPU path): the trainer's own model object serves the harness, in process,
  through a `TransformersEngine` built around `trainer.model` and `trainer.processing_class` on
  the first call (no copy, so the weights are always the ones being trained), tagged with
  `policy_version = trainer.state.global_step`.
- `engine="vllm:URL"` with `weight_sync=VLLMWeightTransfer.tmpfs(engine)` (CPU, or any server
  in vLLM's dev mode on this machine): before the rollouts of each new step the trainer's
  weights are pushed into the server (pause, load, label the step, resume), so every episode
  samples from the weights being trained and its trace carries the step as its version
  (`tests/test_real_vllm.py` runs two steps so). A LoRA model's weights go merged, under the
  base model's names (`harness_gym.engines.lora_merge`). On GPUs,
  `GRPOConfig(use_vllm=True, vllm_mode="server")` has TRL push the weights itself before every
  `rollout_func` call (NCCL; `trl vllm-serve` is `vllm serve` plus weight endpoints); pointing
  the env's engine at that server is the hook, and `vllm_importance_sampling_correction` then
  corrects with the trace's p_old.
- any other engine spec or `Engine` object is passed to the env unchanged (its weights are then
  the caller's business).
- `executor="ray"` or `executor=RayCluster(...)` (`harness_gym.scaleout.ray_cluster`; an async
  trainer passes the same value through) runs the episodes on a Ray cluster: the engine must then
  be a spec every node loads (`vllm:URL`); placeholder rows take their tokens from a copy loaded
  here.

How TRL uses p_old (`logprobs`): without vLLM it does not put them in the loss. Its "old" logprobs
are its own re-computation with the trainer's model (only when generation and optimisation steps
are misaligned, e.g. `steps_per_generation > gradient_accumulation_steps`; otherwise the detached
current logprobs), and the rollout's logprobs go to `sampling_per_token_logps` (used by the
off-policy mask). With the in-process engine both are the same weights, so they agree (the tests
pin this to 1e-4). Sample with the trainer's temperature (it divides logits by it when it
re-scores): this function copies `temperature`, `top_p` and `top_k` from `trainer.args`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from ..config import EpisodeConfig
from ..engines import Engine, load_engine
from ..engines.lora_merge import merged_named_parameters
from ..engines.transformers_engine import TransformersEngine, default_stop_token_ids
from ..scaleout.executors import ExecutorSpec, executor_factory
from ..scaleout.ray_cluster import RayCluster
from ..tasks.loader import TaskSpec, load_tasks
from ..tasks.task import Task
from ..trace import TraceSegment
from .dynamic_sampling import DynamicSampling, refill_groups

if TYPE_CHECKING:
    from .weight_transfer import VLLMWeightTransfer

log = logging.getLogger(__name__)

__all__ = ["HarnessRolloutFunc", "harness_reward", "make_rollout_func", "task_dataset"]


def make_rollout_func(
    harness: str | Sequence[str] | None = None,
    engine: str | Engine | None = None,
    tasks: TaskSpec | list[Task] = "builtin",
    group_size: int | None = None,
    *,
    max_tokens: int | None = None,
    config: EpisodeConfig | None = None,
    executor: ExecutorSpec = "threads",
    dynamic_sampling: DynamicSampling | int | None = None,
    weight_sync: VLLMWeightTransfer | None = None,
    **settings: Any,
) -> HarnessRolloutFunc:
    """A `rollout_func` for `GRPOTrainer` that runs one harness episode per prompt row.

    `group_size` defaults to the trainer's `num_generations` (rows come in runs of that many
    identical prompts; each run is one GRPO group on the vector env). `max_tokens` caps every
    model call of an episode (default: `trainer.args.max_completion_length`). Every other
    keyword is an episode setting of `EpisodeConfig` (`sandbox`, `reward`, `episode_timeout_s`,
    `test_timeout_s`, `context_overflow`, `progress`, ...), or pass `config=`; sampling comes
    from the trainer's arguments. `harness` defaults to the config's (Pi). `executor` is where
    the episodes run, as `make_vec` takes it ("threads", "ray", a `RayCluster`).
    `dynamic_sampling` (a `DynamicSampling`, or its `max_extra_draws` as an int) replaces
    groups whose rewards are all equal by freshly drawn ones and masks what is left out of the
    loss (`integrations/dynamic_sampling.py`); each call's counts go to `sampling_stats`, with
    `batch_passed` (passes among the batch's own episodes, before any refill), `run_episodes`
    and `run_passed` (every episode run, the drawn groups' included): the rows trained on
    favour groups with a pass, so only these say how often the policy passes.
    `weight_sync` pushes the trainer's weights into the engine's vLLM server whenever the step
    has moved (see the module docstring).
    """
    if weight_sync is not None and engine is None:
        raise ValueError("weight_sync moves the trainer's weights into a vLLM server: give "
                         "engine= (the VLLMEngine the transfer feeds)")
    given = {"progress": False} if config is None else {}
    given.update(settings)
    if harness is not None:
        given["harness"] = harness
    if engine is not None:
        given["engine"] = engine
    return HarnessRolloutFunc(
        EpisodeConfig.build(config, **given), tasks=tasks,
        group_size=group_size, max_tokens=max_tokens, use_trainer_model=engine is None,
        executor=executor,
        dynamic_sampling=(DynamicSampling(max_extra_draws=dynamic_sampling)
                          if isinstance(dynamic_sampling, int) else dynamic_sampling),
        weight_sync=weight_sync,
    )


class HarnessRolloutFunc:
    """Callable as `rollout_func(prompts, trainer)`; see the module docstring.

    Holds one `HarnessVectorEnv` per batch shape (train and eval batches may differ), created on
    first use; `close()` releases them (and the in-process engine), and it is also called when
    training ends. A closed instance starts again on its next call. With `use_trainer_model`,
    the config's engine is replaced by one around the trainer's own model.
    """

    def __init__(
        self,
        config: EpisodeConfig,
        *,
        tasks: TaskSpec | list[Task],
        group_size: int | None,
        max_tokens: int | None,
        use_trainer_model: bool,
        executor: ExecutorSpec = "threads",
        dynamic_sampling: DynamicSampling | None = None,
        weight_sync: VLLMWeightTransfer | None = None,
    ) -> None:
        if group_size is not None and group_size < 1:
            raise ValueError(f"group_size must be positive, got {group_size}")
        self.executor = executor_factory(executor)
        if use_trainer_model and isinstance(self.executor, RayCluster):
            raise ValueError("the trainer's in-process model cannot serve episodes on other "
                             "machines: with a Ray executor give engine='vllm:URL'")
        self.config = config
        self.tasks = load_tasks(tasks)
        self.group_size = group_size
        self.max_tokens = max_tokens
        self._use_trainer_model = use_trainer_model
        self._by_id = {t.instance_id: t for t in self.tasks}
        self._by_statement = {t.problem_statement.strip(): t for t in self.tasks}
        self._engine: Engine | None = None  # the in-process engine we built, if any
        self._local_copy: Engine | None = None  # the engine spec loaded here (Ray: placeholders)
        self._envs: dict[tuple[int, int], Any] = {}
        self._callback_added: set[int] = set()
        self.last_infos: dict[str, Any] | None = None  # the latest step's batched infos
        self.dynamic_sampling = dynamic_sampling
        # one record per call with dynamic sampling: step, groups, kept, dropped_zero_variance,
        # refilled, masked, extra_draws
        self.sampling_stats: list[dict[str, int]] = []
        self.weight_sync = weight_sync
        self._synced_version: int | None = None  # the step whose weights the server holds

    @property
    def engine(self) -> Engine | None:
        """The in-process engine serving the rollouts (its `prefix_cache_stats`, ...), once the
        first call built it; None with an engine spec."""
        return self._engine

    # --- the rollout ----------------------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        tasks = [self.task_for(p) for p in prompts]
        group = self._group_size(tasks, trainer)
        self._close_at_train_end(trainer)
        rows = self._run(tasks, group, trainer)
        if self.dynamic_sampling is not None and group > 1:
            version = int(trainer.state.global_step)
            in_batch = {t.instance_id for t in tasks}
            # Refills favour groups with a pass, so the rows trained on overstate how often the
            # policy passes: count the batch's own episodes, and every episode run, apart.
            ran = list(rows["outcome"])
            batch_passed = ran.count("passed")

            def run_drawn(drawn: list[Task]) -> dict[str, list[Any]]:
                new = self._run([t for t in drawn for _ in range(group)], group, trainer)
                ran.extend(new["outcome"])
                return new

            rows, stats = refill_groups(
                rows, group, [t for t in self.tasks if t.instance_id not in in_batch],
                run_drawn, self.dynamic_sampling, step=version)
            self.sampling_stats.append({"step": version, **stats, "batch_passed": batch_passed,
                                        "run_episodes": len(ran),
                                        "run_passed": ran.count("passed")})
            log.info("dynamic sampling, step %d: %s", version, stats)
        return rows

    def _run(self, tasks: list[Task], group: int, trainer: Any) -> dict[str, list[Any]]:
        """One env step over `tasks` (runs of `group` identical ones): the rows."""
        model = _unwrap(trainer)
        envs = self._env(len(tasks), group, self._resolve_engine(trainer, model), trainer)
        version = int(trainer.state.global_step)
        if self.weight_sync is not None and model is not None and version != self._synced_version:
            # merged: a LoRA model's server takes the base model's names (engines/lora_merge.py)
            self.weight_sync.push(merged_named_parameters(model), version=version)
            self._synced_version = version
        try:
            engine: Engine | None = envs.unwrapped.engine  # the Engine, whichever way given
        except AttributeError:  # a Ray executor: every node loaded its own
            engine = None
        # On Ray the step's action carries the version to every node; a local copy of the
        # engine spec labels a shared vLLM server after TRL's sync, as the env's engine would.
        tag_policy_version(engine if engine is not None else self._local_engine(), version,
                           trainer)
        envs.reset(options={"task_ids": [t.instance_id for t in tasks[::group]]})
        training = model.training if model is not None else False
        if model is not None and self._engine is not None:
            model.eval()  # the policy samples without dropout, as p_old promises
        try:
            _, rewards, _, _, infos = envs.step(
                {"policy_version": np.full(len(tasks), version)})
        finally:
            if model is not None:
                model.train(training)
        self.last_infos = infos
        return self._rows(tasks, rewards, infos, engine)

    def task_for(self, prompt: Any) -> Task:
        """The task a TRL prompt names (see the module docstring)."""
        text = _prompt_text(prompt).strip()
        task = self._by_id.get(text) or self._by_statement.get(text)
        if task is None:
            named = [t for t in self.tasks if t.instance_id in text]
            if named:
                task = max(named, key=lambda t: len(t.instance_id))
        if task is None:
            known = ", ".join(list(self._by_id)[:5])
            raise ValueError(
                f"prompt {text[:80]!r} names no task of this suite: a prompt is a task's "
                f"instance_id or problem statement, or contains an instance_id (known: {known}, "
                f"...); build the dataset with harness_gym.integrations.trl.task_dataset()")
        return task

    def _rows(self, tasks: list[Task], rewards: np.ndarray, infos: dict[str, Any],
              engine: Engine | None) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {k: [] for k in (
            "prompt_ids", "completion_ids", "logprobs", "env_mask", "reward", "outcome",
            "task_id", "n_tool_calls", "policy_version", "n_segments")}
        for i, task in enumerate(tasks):
            trace = list(infos["trace"][i] or [])
            segment = training_segment(trace)
            if segment is None:
                segment = placeholder_segment(engine or self._local_engine(), task)
            out["prompt_ids"].append(list(segment["prompt_ids"]))
            out["completion_ids"].append(list(segment["response_ids"]))
            out["logprobs"].append([float(x) for x in segment["response_logprobs"]])
            out["env_mask"].append([int(x) for x in segment["loss_mask"]])
            out["reward"].append(float(rewards[i]))
            out["outcome"].append(str(infos["outcome"][i]))
            out["task_id"].append(task.instance_id)
            out["n_tool_calls"].append(int(infos["n_tool_calls"][i]))
            out["policy_version"].append(segment["policy_version"])
            out["n_segments"].append(len(trace))
        return out

    # --- resources ------------------------------------------------------------------------

    def _group_size(self, tasks: list[Task], trainer: Any) -> int:
        """Runs of identical prompts form the env's groups; anything else runs ungrouped."""
        if self.group_size is not None:
            group = self.group_size
        else:
            training = getattr(trainer.model, "training", True)
            group = trainer.num_generations if training else trainer.num_generations_eval
        group = int(group or 1)
        aligned = len(tasks) % group == 0 and all(
            tasks[k] is t for k in range(0, len(tasks), group) for t in tasks[k:k + group])
        if not aligned:
            log.warning("the %d prompts do not come in runs of %d identical ones: running them "
                        "ungrouped", len(tasks), group)
            return 1
        return group

    def _resolve_engine(self, trainer: Any, model: Any) -> Engine | str:
        if not self._use_trainer_model:
            return self.config.engine
        if self._engine is None or self._engine.model is not model:
            if self._engine is not None:
                self._close_envs()
                self._engine.close()
            training = model.training
            tokenizer = trainer.processing_class
            tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps one
            self._engine = TransformersEngine(
                model, tokenizer, model_name="policy",
                stop_token_ids=default_stop_token_ids(model, tokenizer))
            model.train(training)  # TransformersEngine put it in eval mode
        return self._engine

    def _local_engine(self) -> Engine:
        if self._local_copy is None:
            self._local_copy = load_engine(self.config.engine)
        return self._local_copy

    def _env(self, num_envs: int, group: int, engine: Engine | str, trainer: Any) -> Any:
        import gymnasium as gym

        import harness_gym  # noqa: F401  (registers HarnessSWE-v0)

        key = (num_envs, group)
        if key not in self._envs:
            args = trainer.args
            sampling: dict[str, Any] = {
                "temperature": float(args.temperature),
                "max_tokens": int(self.max_tokens or args.max_completion_length or 512),
            }
            if getattr(args, "top_p", None) is not None:
                sampling["top_p"] = float(args.top_p)
            if getattr(args, "top_k", None):
                sampling["top_k"] = int(args.top_k)
            self._envs[key] = gym.make_vec(
                "HarnessSWE-v0", num_envs=num_envs, vectorization_mode="vector_entry_point",
                group_size=group, tasks=self.tasks, executor=self.executor,
                config=self.config.replace(engine=engine, sampling=sampling))
        return self._envs[key]

    def _close_at_train_end(self, trainer: Any) -> None:
        if id(trainer) in self._callback_added or not hasattr(trainer, "add_callback"):
            return
        from transformers import TrainerCallback

        owner = self

        class CloseHarnessEnvs(TrainerCallback):
            def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                owner.close()

        trainer.add_callback(CloseHarnessEnvs())
        self._callback_added.add(id(trainer))

    def _close_envs(self) -> None:
        envs, self._envs = list(self._envs.values()), {}
        for env in envs:
            env.close()

    def close(self) -> None:
        """Close the envs (CLIs, sandboxes, proxies) and the in-process engine. Idempotent."""
        self._close_envs()
        engines, self._engine, self._local_copy = (self._engine, self._local_copy), None, None
        for engine in engines:
            if engine is not None:
                engine.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tag_policy_version(engine: Engine, version: int, trainer: Any) -> None:
    """Make `version` the label of this rollout's calls. With `use_vllm=True,
    vllm_mode="server"`, TRL has just pushed the weights into the vLLM server, and left vLLM's
    own weight label as it was (its `/finish_weight_update` sends no version): a `VLLMEngine`
    then labels the server too (`set_weight_version`), so each call records what the server
    sampled with. Otherwise only the engine's fallback label moves."""
    args = getattr(trainer, "args", None)
    synced = getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", None) == "server"
    if synced:
        engine.set_weight_version(version)
    else:
        engine.policy_version = version


def training_segment(trace: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The trace segment a rollout trains on: the `agent` segment with the most sampled tokens
    (the first of equals), or None when there is none."""
    agents = [s for s in trace if s["role"] == "agent" and any(s["loss_mask"])]
    return max(agents, key=lambda s: sum(s["loss_mask"]), default=None)


def placeholder_segment(engine: Engine, task: Task) -> dict[str, Any]:
    """The row of a rollout with no agent segment: the task's prompt and one end-of-turn token
    outside the loss (`loss_mask` 0), so it keeps its reward and adds no gradient."""
    prompt = list(engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": task.problem_statement}],
        add_generation_prompt=True, return_dict=False))
    stop = int((engine.stop_token_ids or (engine.tokenizer.eos_token_id,))[0])
    segment = TraceSegment("agent", prompt + [stop], len(prompt), loss_mask=[0],
                           response_logprobs=[0.0])
    return {**segment.to_dict(), "policy_version": None}  # no call was made


def harness_reward(completions: list[Any], reward: list[float], **kwargs: Any) -> list[float]:
    """A TRL reward function returning the env's test-gated reward (the `reward` extra field)."""
    return [float(r) for r in reward]


def task_dataset(
    tasks: TaskSpec | list[Task] = "builtin", *, repeat: int = 1, conversational: bool = False
) -> Any:
    """A `datasets.Dataset` with one row per task (times `repeat`): `prompt` (the problem
    statement, or a one-message conversation) and `task_id`."""
    from datasets import Dataset

    loaded = load_tasks(tasks)
    rows = [t for _ in range(repeat) for t in loaded]
    prompts: list[Any] = [
        [{"role": "user", "content": t.problem_statement}] if conversational
        else t.problem_statement for t in rows]
    return Dataset.from_dict({"prompt": prompts, "task_id": [t.instance_id for t in rows]})


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):  # a conversation: its last user message
        for message in reversed(prompt):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, list):
                    return "".join(part.get("text", "") for part in content
                                   if isinstance(part, dict))
                return str(content or "")
    raise TypeError(f"a prompt is a string or a list of chat messages, got {prompt!r:.100}")


def _unwrap(trainer: Any) -> Any:
    """The trainer's model; for a peft model the model inside it (its LoRA layers in place):
    an engine calls it with a KV cache, which a peft model's forward drops unused."""
    accelerator = getattr(trainer, "accelerator", None)
    model = getattr(trainer, "model", None)
    if accelerator is not None and model is not None:
        model = accelerator.unwrap_model(model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model
