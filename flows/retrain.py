"""The ``retrain`` flow: evidence -> candidate -> judged against the champion -> signed -> registered -> rolled out.

Each task calls one public function of ``models`` (or of this package's thin adapters) and takes the one
:class:`~flows.settings.RetrainSettings` object, so a test swaps the whole configuration:

1. ``load-evidence``: the labeled windows, split into training and the recent held-out window.
2. ``train-candidate``: tokenizer, model and threshold from the training windows (a checkpoint in the run folder).
3. ``judge``: candidate and champion scored on the same held-out windows, each at its own threshold; the candidate
   is promoted only if it beats the champion's promotion metric by the margin. The comparison table becomes a Prefect
   artifact of the run, whatever the verdict.
4. Promoted only: ``export-and-sign`` (int8 ONNX, parity-checked, manifest signed with the private key read from
   ``signing_key``), ``register`` (a new immutable registry version), ``roll-out`` (staged: canaries, then the fleet;
   rolled back to the previous champion if the canaries do not report it healthy). The registry's champion moves only
   after a successful rollout; a rolled-back candidate is marked rejected.

The private key never leaves the step that uses it: export reads it from its file to sign the manifest, roll-out
to sign each release message (with the key rotation chain in ``keyring.json`` beside it, and an expiry
``release_validity`` after issue); only its public ``key_id`` appears in logs, artifacts and Kafka messages. Large
values (thousands of windows) are passed to tasks under ``quote`` so Prefect does not walk them looking for futures.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.utilities.annotations import quote
from pydantic import BaseModel, ConfigDict

from flows.evidence import Evidence, split_evidence
from flows.labeled import read_labeled_windows
from flows.promotion import Comparison, ModelEvaluation, comparison_markdown, evaluate_model, held_out_summary, judge
from flows.rejections import mark_rejected
from flows.retries import BROKER_TROUBLE, retry_on
from flows.rollout import KafkaHeartbeats, KafkaReleaseChannel, RolloutReport, staged_rollout
from flows.settings import RetrainSettings
from flows.training import train_candidate_on
from models.edge.object_registry import open_registry
from models.edge.registry import ModelRegistry, RegistryEntry, release_for
from models.edge.releases import ReleaseSigner
from models.edge.signing import TrustedKeys, key_id, load_private_key, load_public_keys
from models.training.dataset import Fleet
from models.training.export import ExportParityError
from precursor.contracts.object_store import describe, is_url

COMPARISON_ARTIFACT_KEY = "retrain-comparison"

Outcome = Literal["promoted", "not_promoted", "export_refused", "rolled_back", "rejected"]


class RetrainReport(BaseModel):
    """What one ``retrain`` run decided and did."""

    model_config = ConfigDict(frozen=True)

    outcome: Outcome
    version: str
    comparison: Comparison
    checkpoint: Path
    artifact: Path | None = None
    rollout: RolloutReport | None = None
    champion_before: str | None = None
    champion_after: str | None = None
    reason: str = ""
    seconds: float = 0.0


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except Exception:  # outside a flow or task run (a plain function call in a unit test)
        return logging.getLogger("precursor.flows.retrain")


def trusted_keys_of(settings: RetrainSettings) -> TrustedKeys:
    return load_public_keys(settings.trusted_keys if len(settings.trusted_keys) != 1 else settings.trusted_keys[0])


def registry_of(settings: RetrainSettings) -> ModelRegistry:
    """The registry the settings name: a local folder, or on an object store (verified local copies in the cache)."""
    return open_registry(
        settings.registry, trusted_keys_of(settings), settings.model_name, settings=settings.object_store
    )


def check_signing_key(settings: RetrainSettings) -> str:
    """The signing key's public id, after checking the key loads and the registry trusts it (before any training)."""
    public_id = key_id(load_private_key(settings.signing_key).public_key())
    trusted = trusted_keys_of(settings)
    if public_id not in trusted:
        raise ValueError(
            f"signing_key={settings.signing_key} has key_id {public_id}, which is not among trusted_keys "
            f"({', '.join(sorted(trusted)) or 'none'}): the registry would refuse what it signs"
        )
    return public_id


def new_version(registry: ModelRegistry, work_dir: Path, now: datetime) -> str:
    """A version named after the run's time, unique in the registry (``2026.03.01.120000``, then ``-2``, ...)."""
    base = now.astimezone(UTC).strftime("%Y.%m.%d.%H%M%S")
    taken = {e.version for e in registry.list()}
    version, n = base, 1
    while version in taken or registry.holds(version) or (work_dir / version).exists():
        n += 1
        version = f"{base}-{n}"
    return version


# --- tasks ---------------------------------------------------------------------------------------------------------


@task(
    name="load-evidence", retries=2, retry_delay_seconds=5, retry_condition_fn=retry_on(OSError), cache_policy=NO_CACHE
)
def load_evidence(settings: RetrainSettings) -> Evidence:
    fleet = Fleet.load(settings.telemetry, settings.events, settings.machines)
    labeled = read_labeled_windows(
        settings.labeled_dataset, fleet, settings.training.window_spec(), settings.object_store
    )
    evidence = split_evidence(labeled.windows, holdout_h=settings.holdout_h, horizon_h=settings.horizon_h)
    _logger().info(
        "evidence: %d labeled windows (%d examples, %d without telemetry), %d for training, %d held out (from %s)",
        len(labeled.windows),
        labeled.rows,
        labeled.without_telemetry,
        len(evidence.training),
        len(evidence.held_out),
        datetime.fromtimestamp(evidence.held_out_from_s, UTC).isoformat(),
    )
    return evidence


@task(name="train-candidate", cache_policy=NO_CACHE)
def train_candidate(evidence: Evidence, settings: RetrainSettings, checkpoint_dir: Path) -> Path:
    result = train_candidate_on(
        evidence.training,
        checkpoint_dir,
        settings.training,
        data={"labeled_dataset": describe(settings.labeled_dataset)},
    )
    _logger().info(
        "candidate trained in %.1f s: best step %d, validation %s",
        result.seconds,
        result.meta.step,
        {k: v for k, v in result.meta.validation.items() if isinstance(v, float)},
    )
    return result.checkpoint_dir


@task(name="judge", cache_policy=NO_CACHE)
def judge_candidate(
    evidence: Evidence, settings: RetrainSettings, checkpoint_dir: Path, version: str
) -> tuple[Comparison, str | None]:
    """(comparison, champion version): both models on the held-out windows, and the verdict."""
    from models.edge.runtime import LMScorer
    from models.training.model import TorchScorer, read_meta

    every_h = settings.training.every_h
    candidate = evaluate_model(
        TorchScorer.load(checkpoint_dir), version, evidence.held_out, read_meta(checkpoint_dir).threshold, every_h
    )
    registry = registry_of(settings)
    champion_entry = registry.champion()
    champion: ModelEvaluation | None = None
    if champion_entry is not None:
        scorer = LMScorer.load(champion_entry.path, registry.trusted_keys)
        champion = evaluate_model(scorer, champion_entry.version, evidence.held_out, scorer.threshold, every_h)
    verdict = judge(
        candidate,
        champion,
        metric=settings.promotion_metric,
        margin=settings.promotion_margin,
        min_failures=settings.min_holdout_failures,
    )
    comparison = Comparison(
        metric=settings.promotion_metric,
        margin=settings.promotion_margin,
        held_out=held_out_summary(evidence.held_out, evidence.held_out_from_s, evidence.until_s),
        candidate=candidate,
        champion=champion,
        verdict=verdict,
    )
    _logger().info("verdict: %s", verdict.reason)
    return comparison, champion_entry.version if champion_entry is not None else None


@task(name="record-comparison", cache_policy=NO_CACHE)
def record_comparison(comparison: Comparison) -> str:
    markdown = comparison_markdown(comparison)
    if FlowRunContext.get() is not None:
        create_markdown_artifact(
            key=COMPARISON_ARTIFACT_KEY,
            markdown=markdown,
            description=f"candidate {comparison.candidate.version}: {comparison.verdict.reason}",
        )
    return markdown


@task(name="export-and-sign", cache_policy=NO_CACHE)
def export_and_sign(evidence: Evidence, settings: RetrainSettings, checkpoint_dir: Path, version: str) -> Path:
    from models.training.export import export_artifact

    artifact = export_artifact(
        checkpoint_dir,
        checkpoint_dir.parent / "artifact",
        version,
        settings.signing_key,  # a path: the key is read inside the export, never held by the flow
        calibration_windows=[w.window for w in evidence.held_out] or None,
        model_name=settings.model_name,
    )
    _logger().info("exported and signed %s %s", settings.model_name, version)
    return artifact


@task(name="register", cache_policy=NO_CACHE)
def register(settings: RetrainSettings, artifact: Path) -> RegistryEntry:
    registry = registry_of(settings)
    entry = registry.publish(artifact)
    _logger().info(
        "registered %s %s at %s (signed by key %s)",
        entry.model_name,
        entry.version,
        registry.location_of(entry.version),
        entry.key_id,
    )
    return entry


@task(
    name="roll-out",
    retries=2,
    retry_delay_seconds=10,
    retry_condition_fn=retry_on(*BROKER_TROUBLE),
    cache_policy=NO_CACHE,
)
def roll_out(settings: RetrainSettings, entry: RegistryEntry, previous: RegistryEntry | None) -> RolloutReport:
    def uri(e: RegistryEntry) -> str | None:
        # Edges fetch from where the registry is (an object store URL), unless told otherwise; a local registry's
        # entries announce their file:// URI.
        base = settings.artifact_base_uri or (settings.registry if is_url(settings.registry) else None)
        return f"{str(base).rstrip('/')}/{e.model_name}/{e.version}" if base else None

    candidate = release_for(entry.path, artifact_uri=uri(entry), target=settings.release_target)
    before = (
        release_for(previous.path, artifact_uri=uri(previous), target=settings.release_target) if previous else None
    )
    sign = ReleaseSigner.from_key_file(settings.signing_key, settings.release_validity)  # read here, kept here
    channel = KafkaReleaseChannel(settings.kafka)
    try:
        return staged_rollout(
            candidate,
            before,
            channel,
            lambda: KafkaHeartbeats(settings.kafka),
            canary_edges=settings.canary_edges,
            deadline_s=settings.canary_deadline_s,
            healthy_heartbeats=settings.healthy_heartbeats,
            report=_logger().info,
            sign=sign,
        )
    finally:
        channel.close()


# --- the flow ------------------------------------------------------------------------------------------------------


@flow(name="retrain", log_prints=False)
def retrain(settings: RetrainSettings | None = None) -> RetrainReport:
    """Retrain on the labeled evidence; promote, sign, register and roll out the candidate only if it wins."""
    settings = settings or RetrainSettings()
    started = time.monotonic()
    log = _logger()
    signer = check_signing_key(settings)
    log.info("signing with key %s", signer)
    registry = registry_of(settings)
    version = new_version(registry, settings.work_dir, datetime.now(UTC))
    run_dir = settings.work_dir / version
    run_dir.mkdir(parents=True, exist_ok=False)

    evidence = load_evidence(settings)
    checkpoint = train_candidate(quote(evidence), settings, run_dir / "checkpoint")
    comparison, champion_before = judge_candidate(quote(evidence), settings, checkpoint, version)
    record_comparison(comparison)

    def report(outcome: Outcome, **more: Any) -> RetrainReport:
        champion = registry.champion()
        return RetrainReport(
            outcome=outcome,
            version=version,
            comparison=comparison,
            checkpoint=checkpoint,
            champion_before=champion_before,
            champion_after=champion.version if champion is not None else None,
            seconds=time.monotonic() - started,
            **more,
        )

    if not comparison.verdict.promote:
        return report("not_promoted", reason=comparison.verdict.reason)

    try:
        artifact = export_and_sign(quote(evidence), settings, checkpoint, version)
    except ExportParityError as err:
        # The int8 model would not make the decisions that won: nothing faithful to promote.
        log.error("candidate %s won but its export was refused: %s", version, err)
        return report("export_refused", reason=str(err))
    entry = register(settings, artifact)
    previous = registry.champion()
    if not settings.publish:
        registry.set_champion(entry.version)
        return report("promoted", artifact=entry.path, reason=comparison.verdict.reason)

    rollout = roll_out(settings, entry, previous)
    if rollout.outcome == "released":
        registry.set_champion(entry.version)
        return report("promoted", artifact=entry.path, rollout=rollout, reason=rollout.reason)
    mark_rejected(registry, entry.version, rollout.reason)
    return report(
        "rolled_back" if rollout.outcome == "rolled_back" else "rejected",
        artifact=entry.path,
        rollout=rollout,
        reason=rollout.reason,
    )
