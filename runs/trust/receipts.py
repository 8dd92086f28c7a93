"""Receipts: one per settled reply, chained per run, signed by the worker that did the work
and countersigned by the conductor, so spending can be audited after the fact.

A receipt is canonical JSON (workers.keys.canonical). Its hash is the sha256 of that JSON;
each receipt names the previous receipt's hash (`prev`, null for the first) and its place
(`seq`, from 1), so removing, reordering or editing one breaks the chain where it happened.

The worker's signature is the one it put on its result when it sent it: over the result
claim (workers.signing.result_claim) that the receipt's run, attempt, worker, output sha256
and tokens rebuild. The worker cannot sign more than that: the verdict, the payment and
the chain are decided after its reply, by the conductor, which signs {"hash", "worker_sig"},
binding its word on the whole receipt to the worker's word on the work. The chain's hash
is its last receipt's hash.

Receipts live in the run's trace as `Receipt.Emit` instant events whose attrs are
ReceiptAttrs; `frlm_receipts verify RUN_ID` checks them (receipts_verify). A chain vouches
for nothing by itself: it is checked against the conductor's own public key, the keys the
worker registry issued, and the count and chain hash the run recorded when it ended
(Run.accounts["receipts"]), so a chain cut short, lengthened or issued again does not pass.

Amounts (price, cost, paid) are exact dollars spelt as canonical decimal strings
(frlm_web.money.money_str: "0.00075"), so the signed bytes are the books' exact figures.
Receipts issued before money was exact carry JSON numbers instead; they still verify as
they were signed (the hash covers the JSON they were stored with), and `receipt_amount`
reads either spelling. One receipt never mixes the two."""

from __future__ import annotations

import functools
import hashlib
import math
import threading
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from frlm_web.money import is_money_str, money, money_str
from runs.models import Run
from traces import store
from workers import keys
from workers.attestation import utc_now
from workers.models import Worker
from workers.signing import ResultClaim

RECEIPT_EVENT = "Receipt.Emit"


class ReceiptPrice(TypedDict):
    per_1k_in: str  # dollars per 1,000 tokens, frlm_web.money.money_str
    per_1k_out: str


class Receipt(TypedDict):
    run: str
    span: str  # the settled sub-query's span
    attempt: str  # the attempt whose result the worker signed ("<sub-query>.<attempt>")
    worker: str
    input_sha256: str
    output_sha256: str
    tokens_in: int
    tokens_out: int
    price: ReceiptPrice
    cost: str  # what the work cost at the worker's price: exact dollars (money_str)
    paid: str  # what is paid for it: the cost when the reply was not judged wrong, else "0"
    verdict: str  # how the reply was judged: accepted, unverified, rejected, unresolved, ...
    time: str  # ISO 8601, UTC
    prev: str | None  # the previous receipt's hash in this run; None for the first
    seq: int  # 1, 2, 3, ... in this run


class ReceiptAttrs(TypedDict):
    """The attrs of a Receipt.Emit event."""

    receipt: Receipt
    hash: str
    worker_sig: str
    worker_key: str
    conductor_sig: str
    conductor_key: str


_RECEIPT_TYPES: dict[str, tuple[type, ...]] = {
    "run": (str,),
    "span": (str,),
    "attempt": (str,),
    "worker": (str,),
    "input_sha256": (str,),
    "output_sha256": (str,),
    "tokens_in": (int,),
    "tokens_out": (int,),
    "price": (dict,),
    "cost": (str, int, float),
    "paid": (str, int, float),
    "verdict": (str,),
    "time": (str,),
    "prev": (str, type(None)),
    "seq": (int,),
}
_ATTR_KEYS = ("receipt", "hash", "worker_sig", "worker_key", "conductor_sig", "conductor_key")


def receipt_hash(receipt: Receipt) -> str:
    return hashlib.sha256(keys.canonical(receipt)).hexdigest()


def countersigned(hash_: str, worker_sig: str) -> dict[str, str]:
    """What the conductor signs: its word on this receipt and on the worker's signature."""
    return {"hash": hash_, "worker_sig": worker_sig}


# Verdicts under which a reply is paid for: it was not judged wrong.
PAID_VERDICTS = frozenset({"accepted", "unverified", "validator"})


def receipt_claim(receipt: Receipt) -> ResultClaim:
    """The result claim the worker signed, rebuilt from the receipt: a receipt whose work
    figures differ from what the worker sent no longer carries its signature."""
    return {
        "run_id": receipt["run"],
        "sq_id": receipt["attempt"],
        "worker_id": receipt["worker"],
        "status": "ok",
        "text_sha256": receipt["output_sha256"],
        "tokens_in": receipt["tokens_in"],
        "tokens_out": receipt["tokens_out"],
    }


def receipt_worker_sign(receipt: Receipt, key: Ed25519PrivateKey) -> str:
    """The signature a worker holding `key` put on the result this receipt pays for (what
    workers.signing.result_sign made when it sent it): for tests and simulations."""
    return keys.sign(key, receipt_claim(receipt))


def receipt_attrs(
    receipt: Receipt,
    *,
    worker_sig: str,
    worker_key: str,
    conductor_key: Ed25519PrivateKey,
    worker_sig_checked: bool = False,
) -> ReceiptAttrs:
    """The Receipt.Emit attrs of a worker-signed receipt, countersigned by the conductor.
    Refuses a worker signature that does not verify: the conductor must not vouch for it.
    `worker_sig_checked` says the caller has verified this signature over this very claim
    already (the fanout does when the result arrives), which spares a second check."""
    if not worker_sig_checked and not keys.verify(worker_key, receipt_claim(receipt), worker_sig):
        raise ValueError(
            f"the worker signature on the receipt of span {receipt['span']} does not verify "
            f"with worker {receipt['worker']}'s key; not countersigned"
        )
    digest = receipt_hash(receipt)
    return {
        "receipt": receipt,
        "hash": digest,
        "worker_sig": worker_sig,
        "worker_key": worker_key,
        "conductor_sig": keys.sign(conductor_key, countersigned(digest, worker_sig)),
        "conductor_key": keys.public_b64(conductor_key),
    }


@functools.cache
def _key_at(path: Path) -> Ed25519PrivateKey:
    return keys.load_or_create(path)


def conductor_key() -> Ed25519PrivateKey:
    """The conductor's signing key (settings.FRLM_CONDUCTOR_KEY_FILE), made on first use."""
    return _key_at(Path(settings.FRLM_CONDUCTOR_KEY_FILE))


def conductor_public_key() -> str | None:
    """The conductor's public key, or None when it has no key file yet (a checker must not
    make one: a new key would vouch for nothing)."""
    path = Path(settings.FRLM_CONDUCTOR_KEY_FILE)
    if not path.exists():
        return None
    return keys.public_b64(_key_at(path))


class ReceiptChain:
    """Issues one run's receipts in order. Safe for the threads of one conductor: seq and
    prev are taken and advanced under one lock, and only once the receipt is signed, so a
    signature that fails leaves no hole in the chain."""

    def __init__(self, run_id: str, *, head: str | None = None, seq: int = 0) -> None:
        self.run_id = run_id
        self.head = head  # the chain's hash: its last receipt's
        self.seq = seq
        self._lock = threading.Lock()

    def issue(
        self,
        *,
        span: str,
        attempt: str,
        worker: str,
        input_sha256: str,
        output_sha256: str,
        tokens_in: int,
        tokens_out: int,
        price_in: Decimal,
        price_out: Decimal,
        cost: Decimal,
        verdict: str,
        worker_sign: Callable[[Receipt], str],
        worker_key: str,
        conductor_key: Ed25519PrivateKey,
        time: str | None = None,
        worker_sig_checked: bool = False,
    ) -> ReceiptAttrs:
        """The next receipt, with `worker_sign`'s signature (the worker's over its result
        claim) countersigned: the attrs of its Receipt.Emit event. The reply is paid for
        (paid = cost) unless its verdict says it was wrong."""
        # Plain ints and money strings only: what is signed must be what the trace keeps
        # (a numpy number or a Decimal would reach it as text of another spelling).
        bad = [k for k, v in {"tokens_in": tokens_in, "tokens_out": tokens_out}.items() if v < 0]
        amounts: dict[str, str] = {}
        for name, value in {"price_in": price_in, "price_out": price_out, "cost": cost}.items():
            try:
                amounts[name] = money_str(money(value))
            except ValueError:
                bad.append(name)
        if bad:
            raise ValueError(f"a receipt's {', '.join(bad)} must be finite and 0 or more")
        with self._lock:
            receipt: Receipt = {
                "run": self.run_id,
                "span": span,
                "attempt": attempt,
                "worker": worker,
                "input_sha256": input_sha256,
                "output_sha256": output_sha256,
                "tokens_in": int(tokens_in),
                "tokens_out": int(tokens_out),
                "price": {"per_1k_in": amounts["price_in"], "per_1k_out": amounts["price_out"]},
                "cost": amounts["cost"],
                "paid": amounts["cost"] if verdict in PAID_VERDICTS else "0",
                "verdict": verdict,
                "time": time or utc_now(),
                "prev": self.head,
                "seq": self.seq + 1,
            }
            attrs = receipt_attrs(
                receipt,
                worker_sig=worker_sign(receipt),
                worker_key=worker_key,
                conductor_key=conductor_key,
                worker_sig_checked=worker_sig_checked,
            )
            self.head = attrs["hash"]
            self.seq += 1
            return attrs


# --- checking a chain ----------------------------------------------------------------------


class RecordedChain(TypedDict):
    """What a run recorded of its chain when it ended (Run.accounts["receipts"])."""

    count: int
    head: str | None  # the last receipt's hash; None when there is none
    # Set when the watcher that failed the run read these from its trace, its conductor
    # lost (runs/salvage.py): then they cannot show a chain cut short before it died.
    source: NotRequired[str]


class BrokenLink(TypedDict):
    position: int  # 1-based, in seq order; past the trace's last for receipts missing there
    seq: int | None
    span: str | None
    worker: str | None
    problem: str  # malformed, wrong run, hash mismatch, unknown worker, unregistered worker
    # key, bad worker signature, wrong conductor key, bad countersignature, gap, duplicate,
    # broken prev, chain hash mismatch, extra receipt, missing receipts
    detail: str


class ChainReport(TypedDict):
    run: str
    ok: bool
    count: int  # receipts in the trace
    recorded: RecordedChain
    head: str | None  # the chain's hash, when it is whole
    broken: BrokenLink | None
    workers_registered: int  # workers whose key was checked against the registry
    workers_unknown: list[str]  # workers of the chain the registry does not know
    conductor_key: str  # the key every countersignature was checked against
    conductor_key_from: str  # where it came from


def _malformed(attrs: Any) -> str | None:
    if not isinstance(attrs, dict):
        return "the event's attrs are not an object"
    missing = [k for k in _ATTR_KEYS if k not in attrs]
    if missing:
        return f"the event lacks {', '.join(missing)}"
    receipt = attrs["receipt"]
    if not isinstance(receipt, dict):
        return "receipt is not an object"
    wrong = [
        name
        for name, types in _RECEIPT_TYPES.items()
        if name not in receipt
        or not isinstance(receipt[name], types)
        or isinstance(receipt[name], bool)
    ]
    extra = sorted(set(receipt) - set(_RECEIPT_TYPES))
    if wrong or extra:
        return "receipt fields " + ", ".join(
            [f"{n} missing or of the wrong type" for n in wrong] + [f"{n} unknown" for n in extra]
        )
    amounts = {"cost": receipt["cost"], "paid": receipt["paid"]}
    price = receipt["price"]
    amounts.update({f"price {k}": price.get(k) for k in ("per_1k_in", "per_1k_out")})
    spellings = {type(v) is str for v in amounts.values()}
    if len(spellings) > 1:
        return "receipt amounts mix decimal strings and numbers"
    for name, value in amounts.items():
        if not _amount_ok(value):
            return f"receipt {name} is not an amount of dollars ({value!r})"
    return None


def _amount_ok(value: Any) -> bool:
    """A receipt's amount: a canonical money string, or, in receipts issued before money
    was exact, a finite JSON number 0 or more (kept verifiable as they were signed)."""
    if isinstance(value, str):
        return is_money_str(value)
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def receipt_amount(value: str | float) -> Decimal:
    """A receipt's amount as exact dollars, whichever spelling its receipt has."""
    return money(value)


def chain_verify(
    run_id: str,
    entries: list[Any],
    *,
    recorded: RecordedChain,
    worker_keys: Mapping[str, str],
    conductor_key: str,
    conductor_key_from: str = "given",
) -> ChainReport:
    """Check a run's receipts (Receipt.Emit attrs, in any order: they are taken in seq
    order) and name the first broken link. `recorded` is what the run recorded of its
    chain, `worker_keys` maps worker id to its registered public key, and `conductor_key`
    is the conductor's: a receipt signed by any other worker or conductor key is broken."""

    def seq_of(entry: Any) -> float:
        try:
            value = entry["receipt"]["seq"]
        except (TypeError, KeyError):
            return math.inf
        return value if isinstance(value, int) and not isinstance(value, bool) else math.inf

    ordered = sorted(entries, key=seq_of)
    workers = sorted(
        {e["receipt"]["worker"] for e in ordered if _malformed(e) is None},
    )
    report: ChainReport = {
        "run": run_id,
        "ok": True,
        "count": len(ordered),
        "recorded": recorded,
        "head": None,
        "broken": None,
        "workers_registered": sum(1 for w in workers if w in worker_keys),
        "workers_unknown": [w for w in workers if w not in worker_keys],
        "conductor_key": conductor_key,
        "conductor_key_from": conductor_key_from,
    }
    prev_hash: str | None = None
    prev_seq = 0
    for position, attrs in enumerate(ordered, start=1):
        if position > recorded["count"]:
            problem = _extra_problem(recorded)
        else:
            problem = _link_problem(
                run_id, attrs, worker_keys, conductor_key, prev_hash, prev_seq
            ) or _end_problem(position, attrs, recorded)
        if problem is not None:
            return _broken(report, position, attrs, problem)
        prev_hash = attrs["hash"]
        prev_seq = attrs["receipt"]["seq"]
    if len(ordered) < recorded["count"]:
        return _broken(report, len(ordered) + 1, None, _missing_problem(len(ordered), recorded))
    report["head"] = prev_hash
    return report


def _broken(
    report: ChainReport, position: int, attrs: Any, problem: tuple[str, str]
) -> ChainReport:
    """The report, broken at `position` (attrs None: a receipt missing from the trace)."""
    receipt = attrs.get("receipt") if isinstance(attrs, dict) else None
    receipt = receipt if isinstance(receipt, dict) else {}
    seq = receipt.get("seq") if attrs is not None else position
    report["ok"] = False
    report["broken"] = {
        "position": position,
        "seq": seq if isinstance(seq, int) else None,
        "span": receipt.get("span"),
        "worker": receipt.get("worker"),
        "problem": problem[0],
        "detail": problem[1],
    }
    return report


def _last_hash(recorded: RecordedChain) -> str:
    return f"the last hashing to {recorded['head'][:16]}..." if recorded["head"] else "none"


def _end_problem(position: int, attrs: Any, recorded: RecordedChain) -> tuple[str, str] | None:
    """The run's last receipt by count must be the one the run recorded as its chain's end:
    a chain issued again ends elsewhere, though every link of it holds."""
    if position != recorded["count"] or attrs["hash"] == recorded["head"]:
        return None
    return (
        "chain hash mismatch",
        f"this is the run's last receipt by count, but it hashes to {attrs['hash'][:16]}... "
        f"and the run recorded its chain as ending in {str(recorded['head'])[:16]}...: "
        "this chain is not the one the run issued, and nothing should be paid on it",
    )


def _extra_problem(recorded: RecordedChain) -> tuple[str, str]:
    return (
        "extra receipt",
        f"the run recorded {recorded['count']} receipts ({_last_hash(recorded)}); this one "
        "was added to its trace after the run closed its chain: it is not the conductor's "
        "record of the run, and nothing should be paid on it",
    )


def _missing_problem(count: int, recorded: RecordedChain) -> tuple[str, str]:
    first, last = count + 1, recorded["count"]
    which = f"receipt {first} is" if first == last else f"receipts {first} to {last} are"
    return (
        "missing receipts",
        f"{which} missing at the end (the run recorded {last}, {_last_hash(recorded)}). "
        "If the run has just ended, the recorder may not have stored them yet: check again "
        "shortly; if they stay missing, the trace was cut and cannot show what the run paid",
    )


def _link_problem(
    run_id: str,
    attrs: Any,
    registered: Mapping[str, str],
    conductor_key: str,
    prev_hash: str | None,
    prev_seq: int,
) -> tuple[str, str] | None:
    """(problem, detail) for the first thing wrong with one link, or None."""
    malformed = _malformed(attrs)
    if malformed:
        return "malformed", malformed
    receipt: Receipt = attrs["receipt"]
    if receipt["run"] != run_id:
        return "wrong run", f"the receipt names run {receipt['run']!r}, not {run_id!r}"
    digest = receipt_hash(receipt)
    if digest != attrs["hash"]:
        return (
            "hash mismatch",
            f"the receipt hashes to {digest[:16]}..., the event says {attrs['hash'][:16]}...: "
            "its content was changed after it was issued",
        )
    known = registered.get(receipt["worker"])
    if known is None:
        return (
            "unknown worker",
            f"worker {receipt['worker']} is not in the registry: its key was not issued here, "
            "so its signature proves nothing (check where that worker registered)",
        )
    if attrs["worker_key"] != known:
        return (
            "unregistered worker key",
            f"signed with a key that is not worker {receipt['worker']}'s registered key",
        )
    if not keys.verify(attrs["worker_key"], receipt_claim(receipt), attrs["worker_sig"]):
        return (
            "bad worker signature",
            f"worker {receipt['worker']}'s signature does not cover this receipt's work "
            "(attempt, output sha256, tokens)",
        )
    if attrs["conductor_key"] != conductor_key:
        return (
            "wrong conductor key",
            f"countersigned with {str(attrs['conductor_key'])[:12]}..., not the conductor's "
            f"key {conductor_key[:12]}...",
        )
    if not keys.verify(
        attrs["conductor_key"],
        countersigned(attrs["hash"], attrs["worker_sig"]),
        attrs["conductor_sig"],
    ):
        return "bad countersignature", "the conductor's signature does not verify"
    if receipt["seq"] != prev_seq + 1:
        if receipt["seq"] > prev_seq + 1:
            missing = (
                f"receipt {prev_seq + 1}"
                if receipt["seq"] == prev_seq + 2
                else f"receipts {prev_seq + 1} to {receipt['seq'] - 1}"
            )
            return "gap", f"{missing} missing before receipt {receipt['seq']}"
        return "duplicate", f"receipt {receipt['seq']} comes a second time"
    if receipt["prev"] != prev_hash:
        expected = f"{prev_hash[:16]}..." if prev_hash else "none (it is the first)"
        return (
            "broken prev",
            f"prev is {str(receipt['prev'])[:16]}..., the previous receipt's hash is {expected}",
        )
    return None


def run_receipts(run_id: str) -> list[Any]:
    """The attrs of a run's Receipt.Emit events, in trace order. ValueError when the run
    has no stored trace at all."""
    events = store.read_events(run_id)
    if not events:
        raise ValueError(
            f"run {run_id} has no stored trace (is the id right, and the recorder up?)"
        )
    return [e["attrs"] for e in events if e["name"] == RECEIPT_EVENT]


def registered_worker_keys(worker_ids: list[str]) -> dict[str, str]:
    return dict(Worker.objects.filter(id__in=worker_ids).values_list("id", "public_key"))


def run_recorded_chain(run_id: str) -> RecordedChain:
    """The count and hash of the chain the run's conductor issued, as it recorded them on
    the run when it ended (runs.trust.accounts.ReceiptSummary). ValueError when the run has
    none: without them a chain cut short would look whole."""
    run = Run.objects.filter(id=run_id).only("status", "accounts").first()
    if run is None:
        raise ValueError(
            f"run {run_id} is not in this server's database, where its conductor recorded how "
            "many receipts it issued and their chain hash: check it on that server"
        )
    if not run.done:
        raise ValueError(
            f"run {run_id} is still {run.status}: its conductor records how many receipts it "
            "issued, and their chain hash, when it ends; check again then"
        )
    summary = run.accounts.get("receipts") if isinstance(run.accounts, dict) else None
    summary = summary if isinstance(summary, dict) else {}
    count, head = summary.get("count"), summary.get("head")
    if (
        not isinstance(count, int)
        or isinstance(count, bool)
        or count < 0
        or not (head is None if count == 0 else isinstance(head, str))
    ):
        raise ValueError(
            f"run {run_id} recorded no count and hash of its receipt chain (it ended without "
            "its accounts: its conductor was lost, or it was imported), so whether its trace "
            "holds the whole chain cannot be checked"
        )
    recorded: RecordedChain = {"count": count, "head": head}
    if isinstance(summary.get("source"), str):
        recorded["source"] = summary["source"]
    return recorded


def receipts_verify(run_id: str, *, conductor_key: str | None = None) -> ChainReport:
    """Check the receipt chain stored in a run's trace against the count and hash the run
    recorded, the worker registry, and the conductor's public key: `conductor_key` when
    given (checking on another machine than the conductor's), else this machine's key
    file's. ValueError when there is no trace, no recorded chain, or no key to check with."""
    entries = run_receipts(run_id)
    pinned, pinned_from = conductor_key, "given with --conductor-key"
    if pinned is None:
        pinned, pinned_from = conductor_public_key(), "this server's key file"
    if pinned is None:
        raise ValueError(
            f"no conductor key to check run {run_id}'s receipts against: there is no key file "
            f"here ({settings.FRLM_CONDUCTOR_KEY_FILE}, FRLM_CONDUCTOR_KEY_FILE), and a chain "
            "cannot vouch for its own key. Give the conductor's public key with "
            "--conductor-key B64; `manage.py frlm_receipts key` prints it where the conductor "
            "runs"
        )
    recorded = run_recorded_chain(run_id)
    ids = sorted(
        {
            e["receipt"]["worker"]
            for e in entries
            if isinstance(e, dict)
            and isinstance(e.get("receipt"), dict)
            and isinstance(e["receipt"].get("worker"), str)
        }
    )
    return chain_verify(
        run_id,
        entries,
        recorded=recorded,
        worker_keys=registered_worker_keys(ids),
        conductor_key=pinned,
        conductor_key_from=pinned_from,
    )


def format_report(report: ChainReport) -> str:
    if report["ok"]:
        lines = [
            f"OK: {report['count']} receipts of run {report['run']}, chain whole and as the "
            "run recorded it"
        ]
        if report["recorded"].get("source"):
            lines[0] = (
                f"OK: {report['count']} receipts of run {report['run']}, chain whole as far "
                f"as its trace goes; the run's record of it was {report['recorded']['source']}"
            )
        if report["head"]:
            lines.append(f"chain hash: {report['head']}")
    else:
        broken = report["broken"]
        assert broken is not None
        if broken["position"] > report["count"]:  # missing from the trace's end
            top = (
                f"BROKEN: {broken['problem']}: the trace holds {report['count']} of the "
                f"{report['recorded']['count']} the run recorded"
            )
        else:
            top = (
                f"BROKEN: receipt {broken['position']} of {report['count']} (seq "
                f"{broken['seq']}, span {broken['span']}, worker {broken['worker']}): "
                f"{broken['problem']}"
            )
        lines = [top, f"  {broken['detail']}"]
    unknown = report["workers_unknown"]
    lines.append(
        f"worker keys checked against the registry: {report['workers_registered']}"
        + (f"; not registered here: {', '.join(unknown)}" if unknown else "")
    )
    lines.append(f"conductor key: {report['conductor_key']} ({report['conductor_key_from']})")
    return "\n".join(lines)
