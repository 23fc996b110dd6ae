"""What the sync and the asyncio clients share: channel options and credentials, the retry
policy, request builders (with guarded optional fields), session state and the health check."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
import uuid
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from .errors import UnsupportedField
from ._proto import health_pb2
from ._proto import verify_pb2 as pb

PemSource = Union[bytes, str, "os.PathLike[str]"]
"""PEM data as bytes, or the path of a PEM file."""

TreeLike = Union[pb.DraftTree, Tuple[Sequence[int], Sequence[int]], Mapping[str, Any], None]
"""A draft tree: a DraftTree, a (tokens, parents) pair, a dict, or None for an empty tree."""

ItemLike = Union[pb.VerifyItem, Mapping[str, Any]]
"""A Verify item: a VerifyItem message or a dict with its fields (see :func:`item`)."""

Metadata = Sequence[Tuple[str, str]]

DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
"""Largest message the client sends or receives by default (hidden states can be large;
the server's own limit is its --max_message_bytes)."""

log = logging.getLogger("verifyd")
"""The client's logger: retries (WARNING), calls that fail after retries (ERROR) or with a
server or connection fault (WARNING; other failures, which the caller gets as exceptions,
at DEBUG) and VerifyStream reconnects (INFO). It never prints; with no handler configured
nothing is shown."""
log.addHandler(logging.NullHandler())

SERVICE = "verify.v1.VerifyService"
HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"


# ---------------------------------------------------------------------------------------------
# Retries


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, used only where a retry is safe.

    Safe are GetInfo, CloseSession (a retry that finds the session gone counts as closed),
    TruncateSession (truncating to the same length twice gives the same answer), and Verify
    / VerifyStream messages whose every item carries a ``request_id`` (the server answers a
    repeated id with the stored result, see the retry recipe in verify.proto). OpenSession
    and ForkSession are never retried: a lost answer would leak a session.

    Attributes:
        max_attempts: calls in all, the first one included (1 = no retries).
        initial_backoff_s: the cap of the first pause; each further pause's cap is
            ``backoff_multiplier`` times the previous one, at most ``max_backoff_s``. The
            pause is drawn uniformly from [0, cap] (full jitter).
        retryable_codes: the status codes that are retried.
        total_timeout_s: stop retrying once this much time has passed since the first
            attempt (None: only ``max_attempts`` limits). Each attempt's deadline is the
            smaller of the call's timeout and the time left.
    """

    max_attempts: int = 5
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    backoff_multiplier: float = 2.0
    retryable_codes: FrozenSet[grpc.StatusCode] = frozenset(
        {
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        }
    )
    total_timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("RetryPolicy.max_attempts must be >= 1")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0 or self.backoff_multiplier < 1:
            raise ValueError("RetryPolicy: backoffs must be >= 0 and the multiplier >= 1")

    def backoff_s(self, failures: int, rng: Optional[random.Random] = None) -> float:
        """The pause after the ``failures``-th failed attempt (1-based)."""
        cap = min(
            self.max_backoff_s,
            self.initial_backoff_s * self.backoff_multiplier ** max(0, failures - 1),
        )
        return (rng or random).uniform(0.0, cap)


NO_RETRY = RetryPolicy(max_attempts=1)
"""A policy that sends each call once."""


class RetryLoop:
    """The bookkeeping of one call's attempts under a policy, shared by the sync and asyncio
    clients (they only differ in how they wait): each attempt's deadline, and after a failure
    whether to retry and how long to pause first."""

    def __init__(self, policy: RetryPolicy, per_call_timeout: Optional[float], rng: random.Random):
        self.policy = policy
        self.per_call = per_call_timeout
        self.rng = rng
        self.start = time.monotonic()
        self.attempt = 0

    def next_attempt_timeout(self) -> Optional[float]:
        """Starts an attempt; its deadline in seconds (None: the per-call timeout, unbounded)."""
        self.attempt += 1
        if self.policy.total_timeout_s is None:
            return self.per_call
        left = self.policy.total_timeout_s - (time.monotonic() - self.start)
        timeout = left if self.per_call is None else min(self.per_call, left)
        return max(timeout, 0.001)

    def pause_before_retry(self, code: grpc.StatusCode) -> Optional[float]:
        """After a failed attempt with ``code``: the pause before the next one, or None when
        the call must fail now (attempts or time used up, or a code that is not retried)."""
        delay = self.policy.backoff_s(self.attempt, self.rng)
        out_of_time = self.policy.total_timeout_s is not None and (
            time.monotonic() - self.start + delay >= self.policy.total_timeout_s
        )
        if (
            self.attempt >= self.policy.max_attempts
            or code not in self.policy.retryable_codes
            or out_of_time
        ):
            return None
        return delay


@dataclasses.dataclass(frozen=True)
class RetryEvent:
    """Passed to a client's ``on_retry`` hook before each retry's pause."""

    method: str
    attempt: int  # the attempt that failed (1-based)
    code: grpc.StatusCode
    details: str
    backoff_s: float


OnRetry = Callable[[RetryEvent], None]

# Codes that say the server or the connection is in trouble rather than the request.
_FAULT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
    }
)


def log_retry(event: RetryEvent, max_attempts: int) -> None:
    """Logs a retry, before its pause (WARNING)."""
    log.warning(
        "%s failed with %s (%s) on attempt %d of %d; retrying in %.3f s",
        event.method,
        event.code.name,
        event.details,
        event.attempt,
        max_attempts,
        event.backoff_s,
    )


def log_failure(method: str, code: grpc.StatusCode, details: str, attempts: int) -> None:
    """Logs a call that is about to raise: ERROR after retries, WARNING for a server or
    connection fault, DEBUG otherwise (NOT_FOUND, INVALID_ARGUMENT, ABORTED, ...: the
    request's own outcome, which the caller handles)."""
    if attempts > 1:
        level = logging.ERROR
    elif code in _FAULT_CODES:
        level = logging.WARNING
    else:
        level = logging.DEBUG
    log.log(
        level, "%s failed with %s (%s) after %d attempt(s)", method, code.name, details, attempts
    )


# ---------------------------------------------------------------------------------------------
# Channels


def _read_pem(source: Optional[PemSource]) -> Optional[bytes]:
    if source is None:
        return None
    if isinstance(source, bytes):
        return source
    with open(os.fspath(source), "rb") as f:
        return f.read()


@dataclasses.dataclass
class ChannelConfig:
    """How to reach verifyd (see the server's --tls_* and --auth_token_file flags)."""

    target: str
    tls: Optional[bool] = None
    root_certificates: Optional[PemSource] = None
    client_certificate: Optional[PemSource] = None
    client_key: Optional[PemSource] = None
    token: Optional[str] = None
    server_name_override: Optional[str] = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    options: Sequence[Tuple[str, Any]] = ()

    def use_tls(self) -> bool:
        wants_tls = any(
            x is not None for x in (self.root_certificates, self.client_certificate, self.token)
        )
        if self.tls is None:
            return wants_tls
        if not self.tls and wants_tls:
            raise ValueError(
                "tls=False with TLS material or a bearer token: verifyd accepts tokens only "
                "over TLS (a token would travel in clear text)"
            )
        return self.tls

    def credentials(self) -> Optional[grpc.ChannelCredentials]:
        """The channel credentials, or None for a plaintext channel."""
        if not self.use_tls():
            return None
        if (self.client_certificate is None) != (self.client_key is None):
            raise ValueError("client_certificate and client_key go together (mutual TLS)")
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read_pem(self.root_certificates),
            private_key=_read_pem(self.client_key),
            certificate_chain=_read_pem(self.client_certificate),
        )
        if self.token is not None:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(self.token)
            )
        return creds

    def make_channel(
        self, secure: Callable[..., Any], insecure: Callable[..., Any], **kw: Any
    ) -> Any:
        """A channel to the target, made by ``secure`` (with the credentials) or ``insecure``
        (plaintext): grpc's or grpc.aio's channel constructors; ``kw`` goes to them."""
        creds = self.credentials()
        opts = self.channel_options()
        if creds is not None:
            return secure(self.target, creds, options=opts, **kw)
        return insecure(self.target, options=opts, **kw)

    def channel_options(self) -> List[Tuple[str, Any]]:
        opts: List[Tuple[str, Any]] = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
        ]
        if self.server_name_override:
            opts.append(("grpc.ssl_target_name_override", self.server_name_override))
        opts.extend(self.options)
        return opts


# ---------------------------------------------------------------------------------------------
# Requests


def has_field(message_type: Any, name: str) -> bool:
    """Whether the installed stubs' message type has field ``name`` (fields added to
    verify.proto appear in the client released with them)."""
    return name in message_type.DESCRIPTOR.fields_by_name


def _set_field(msg: Message, name: str, value: Any) -> None:
    desc = msg.DESCRIPTOR.fields_by_name.get(name)
    if desc is None:
        raise UnsupportedField(
            f"{msg.DESCRIPTOR.name}.{name} is not in the verify.proto of this client's stubs; "
            f"install verifyd-client from a newer verifyd source tree"
        )
    if value is None:
        return
    is_repeated = getattr(desc, "is_repeated", None)
    if is_repeated is None:  # protobuf < 5.x
        is_repeated = desc.label == desc.LABEL_REPEATED
    if desc.message_type is not None and not is_repeated:
        target = getattr(msg, name)
        if isinstance(value, Message):
            target.CopyFrom(value)
        else:
            target.Clear()
            json_format.ParseDict(dict(value), target)
        return
    if is_repeated:
        field = getattr(msg, name)
        del field[:]
        if desc.message_type is not None:
            for v in value:
                if isinstance(v, Message):
                    field.add().CopyFrom(v)
                else:
                    json_format.ParseDict(dict(v), field.add())
        else:
            field.extend(_enum_value(desc, v) for v in value)
        return
    setattr(msg, name, _enum_value(desc, value))


def _enum_value(desc: Any, value: Any) -> Any:
    if desc.enum_type is not None and isinstance(value, str):
        return desc.enum_type.values_by_name[value].number
    return value


def set_fields(msg: Message, fields: Mapping[str, Any]) -> Message:
    """Sets fields of ``msg`` by name (messages from dicts or messages; enums by name or
    number); None values are skipped. UnsupportedField when the stubs lack a field."""
    for name, value in fields.items():
        _set_field(msg, name, value)
    return msg


def tree(tokens: Sequence[int] = (), parents: Optional[Sequence[int]] = None) -> pb.DraftTree:
    """A DraftTree. ``parents`` defaults to a chain (-1, 0, 1, ...): a single draft path."""
    tokens = list(tokens)
    if parents is None:
        parents = list(range(-1, len(tokens) - 1))
    return pb.DraftTree(tokens=tokens, parents=list(parents))


def as_tree(t: TreeLike) -> pb.DraftTree:
    if t is None:
        return pb.DraftTree()
    if isinstance(t, pb.DraftTree):
        return t
    if isinstance(t, Mapping):
        return tree(t.get("tokens", ()), t.get("parents"))
    tokens, parents = t
    return tree(tokens, parents)


def item(
    session_id: str,
    draft: TreeLike = None,
    *,
    request_id: Optional[str] = None,
    expected_committed_len: Optional[int] = None,
    **fields: Any,
) -> pb.VerifyItem:
    """A VerifyItem.

    Args:
        session_id: the session.
        draft: the draft tree (empty: one plain decode step).
        request_id: makes the item safe to retry (the server deduplicates it).
        expected_committed_len: ABORTED, nothing applied, unless the session is at this length.
        **fields: any other VerifyItem field by name (e.g. ``draft_probs``); UnsupportedField
            when the installed stubs lack it.
    """
    msg = pb.VerifyItem(session_id=session_id, tree=as_tree(draft))
    if request_id:
        msg.request_id = request_id
    if expected_committed_len is not None:
        msg.expected_committed_len = expected_committed_len
    return set_fields(msg, fields)


def as_item(x: ItemLike) -> pb.VerifyItem:
    if isinstance(x, pb.VerifyItem):
        return x
    fields = dict(x)
    sid = fields.pop("session_id")
    draft = fields.pop("tree", None)
    if draft is None and ("tokens" in fields or "parents" in fields):
        draft = (fields.pop("tokens", ()), fields.pop("parents", None))
    return item(sid, draft, **fields)


def verify_request(items: Iterable[ItemLike]) -> pb.VerifyRequest:
    return pb.VerifyRequest(items=[as_item(x) for x in items])


def retry_safe(req: pb.VerifyRequest) -> bool:
    """A Verify may be resent only when every item carries a request_id."""
    return len(req.items) > 0 and all(it.request_id for it in req.items)


def open_request(
    prompt_tokens: Sequence[int],
    prefix_session_id: Optional[str],
    sampling: Any,
    top_logprobs: Optional[int],
    hidden_states: Any,
    fields: Mapping[str, Any],
) -> pb.OpenSessionRequest:
    req = pb.OpenSessionRequest(prompt_tokens=list(prompt_tokens))
    if prefix_session_id:
        req.prefix_session_id = prefix_session_id
    extra: Dict[str, Any] = dict(fields)
    if sampling is not None:
        extra["sampling"] = sampling
    if top_logprobs is not None:
        extra["top_logprobs"] = top_logprobs
    if hidden_states is not None:
        if isinstance(hidden_states, (list, tuple)):  # just the layers
            hidden_states = {"layers": list(hidden_states)}
        extra["hidden_states"] = hidden_states
    return set_fields(req, extra)


# ---------------------------------------------------------------------------------------------
# Sessions


class SessionState:
    """The client's view of one session: its id, the tokens it knows (prompt, then every
    emitted token; the last one is the pending token), the committed length, and a request
    id counter for exactly-once Verify retries."""

    def __init__(
        self,
        session_id: str,
        known_tokens: List[int],
        committed_len: int,
    ) -> None:
        self.session_id = session_id
        # Tokens at positions [history_offset, committed_len]: the client may not know a
        # prefix opened by id.
        self.history: List[int] = known_tokens
        self.history_offset = committed_len + 1 - len(known_tokens)
        self.committed_len = committed_len
        self._rid_prefix = uuid.uuid4().hex[:12]
        self._rid = 0
        self.closed = False

    @property
    def next_token(self) -> int:
        """The pending token: emitted, its KV not yet computed."""
        return self.history[-1]

    def next_request_id(self) -> str:
        self._rid += 1
        return f"{self._rid_prefix}-{self._rid}"

    def item(
        self, draft: TreeLike, request_id: Optional[str], fields: Mapping[str, Any]
    ) -> pb.VerifyItem:
        return item(
            self.session_id,
            draft,
            request_id=request_id or self.next_request_id(),
            expected_committed_len=self.committed_len,
            **fields,
        )

    def apply(self, result: pb.VerifyResult) -> List[int]:
        """Records a Verify result; returns the tokens it emitted (accepted, then bonus)."""
        want = self.committed_len + 1 + len(result.accepted_tokens)
        if result.committed_len != want:
            raise RuntimeError(
                f"session {self.session_id}: result committed_len {result.committed_len}, "
                f"expected {want} (another writer on this session?)"
            )
        new = list(result.accepted_tokens) + [result.bonus_token]
        self.history.extend(new)
        self.committed_len = result.committed_len
        return new

    def apply_truncate(self, committed_len: int, next_token: int) -> None:
        keep = committed_len - self.history_offset
        if keep >= 0:
            self.history = self.history[:keep] + [next_token]
        else:
            self.history = [next_token]
            self.history_offset = committed_len
        self.committed_len = committed_len

    def fork_state(self, session_id: str) -> "SessionState":
        s = SessionState(session_id, list(self.history), self.committed_len)
        s.history_offset = self.history_offset
        return s


def known_prefix(prefix: Any) -> Tuple[Optional[str], List[int]]:
    """(prefix_session_id, its known committed tokens) for a Session, an id or None."""
    if prefix is None:
        return None, []
    if isinstance(prefix, str):
        return prefix, []
    st: SessionState = prefix._state
    if st.history_offset != 0:
        return st.session_id, []
    return st.session_id, list(st.history[: st.committed_len])


# ---------------------------------------------------------------------------------------------
# grpc.health.v1 Check, with the wire-identical messages of proto/verifyd_client/health.proto


def health_check(channel: Any) -> Any:
    """The grpc.health.v1 Health.Check method of ``channel`` (sync or grpc.aio), taking a
    service name and answering its status name (see :func:`health_status`)."""
    return channel.unary_unary(
        HEALTH_CHECK_METHOD,
        request_serializer=lambda service: health_request(service).SerializeToString(),
        response_deserializer=lambda data: health_status(
            health_pb2.HealthCheckResponse.FromString(data)
        ),
    )


def health_request(service: str) -> Any:
    return health_pb2.HealthCheckRequest(service=service)


def health_status(response: Any) -> str:
    """The status name of a HealthCheckResponse: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"
    or "UNKNOWN" (also for a number this client does not know)."""
    try:
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    except ValueError:
        return "UNKNOWN"
