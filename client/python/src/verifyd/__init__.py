"""verifyd-client: Python client for verifyd, the speculative-decoding verify service.

Quick start::

    import verifyd

    with verifyd.Client("127.0.0.1:50051") as client:
        print(client.get_info().model.name)
        with client.session([1, 2, 3]) as s:          # OpenSession; closed on exit
            r = s.verify(([5, 7, 9], [-1, 0, 0]))      # a draft tree: tokens, parents
            print(r.accepted_tokens, r.bonus_token, s.history)

:class:`Client` / :class:`AsyncClient` have one method per RPC (``get_info``,
``open_session``, ``verify``, ``close_session``, ``truncate_session``, ``fork_session``, and
``verify_stream`` for VerifyStream) returning the protobuf responses, so fields added to
verify.proto pass through. Failed calls raise a :class:`VerifydError` subclass per status
code (:mod:`verifyd.errors`). The message types are in :mod:`verifyd.pb`.
"""

from __future__ import annotations

from ._common import (
    NO_RETRY,
    RetryEvent,
    RetryPolicy,
    has_field,
    item,
    set_fields,
    tree,
)
from ._proto import verify_pb2 as pb
from ._proto import verify_pb2_grpc as pb_grpc
from .acceptance import AcceptanceStats
from .aio import AsyncClient, AsyncSession, AsyncVerifyStream
from .client import Client, Session, VerifyStream
from .errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
    UnsupportedField,
    VerifydError,
    error_class,
    from_rpc_error,
)
from .hidden import (
    hidden_states_dtype,
    hidden_states_shape,
    hidden_states_to_lists,
    hidden_states_to_numpy,
    hidden_states_to_torch,
)
from .ngram import NgramDrafter

try:
    from ._version import __version__  # written by setup.py from verifyd's CMakeLists.txt
except ImportError:  # a source checkout used without building the package
    __version__ = "0+unknown"


__all__ = [
    "AcceptanceStats",
    "Aborted",
    "AlreadyExists",
    "AsyncClient",
    "AsyncSession",
    "AsyncVerifyStream",
    "Cancelled",
    "Client",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NO_RETRY",
    "NgramDrafter",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "RetryEvent",
    "RetryPolicy",
    "Session",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "UnsupportedField",
    "VerifyStream",
    "VerifydError",
    "error_class",
    "from_rpc_error",
    "has_field",
    "hidden_states_dtype",
    "hidden_states_shape",
    "hidden_states_to_lists",
    "hidden_states_to_numpy",
    "hidden_states_to_torch",
    "item",
    "pb",
    "pb_grpc",
    "set_fields",
    "tree",
]
