from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
HIDDEN_DTYPE_BF16: HiddenDtype
HIDDEN_DTYPE_FP32: HiddenDtype

class CloseSessionRequest(_message.Message):
    __slots__ = ["session_id"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class DraftTree(_message.Message):
    __slots__ = ["parents", "tokens"]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    parents: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., parents: _Optional[_Iterable[int]] = ...) -> None: ...

class ForkSessionRequest(_message.Message):
    __slots__ = ["session_id"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ForkSessionResponse(_message.Message):
    __slots__ = ["committed_len", "next_token", "session_id"]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    committed_len: int
    next_token: int
    session_id: str
    def __init__(self, session_id: _Optional[str] = ..., next_token: _Optional[int] = ..., committed_len: _Optional[int] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ["backend", "exact_lossless", "kv_cache_dtype", "limits", "memory", "model", "tp_size", "version"]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    EXACT_LOSSLESS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    backend: str
    exact_lossless: bool
    kv_cache_dtype: str
    limits: Limits
    memory: MemoryInfo
    model: ModelInfo
    tp_size: int
    version: str
    def __init__(self, model: _Optional[_Union[ModelInfo, _Mapping]] = ..., tp_size: _Optional[int] = ..., backend: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., version: _Optional[str] = ..., exact_lossless: bool = ..., kv_cache_dtype: _Optional[str] = ..., memory: _Optional[_Union[MemoryInfo, _Mapping]] = ...) -> None: ...

class HiddenStates(_message.Message):
    __slots__ = ["data", "dtype", "hidden_size", "layers", "num_tokens"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    dtype: HiddenDtype
    hidden_size: int
    layers: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    def __init__(self, layers: _Optional[_Iterable[int]] = ..., hidden_size: _Optional[int] = ..., num_tokens: _Optional[int] = ..., dtype: _Optional[_Union[HiddenDtype, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class HiddenStatesRequest(_message.Message):
    __slots__ = ["dtype", "include_prompt", "layers"]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    dtype: HiddenDtype
    include_prompt: bool
    layers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, layers: _Optional[_Iterable[int]] = ..., include_prompt: bool = ..., dtype: _Optional[_Union[HiddenDtype, str]] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ["kv_slots", "max_batch", "max_context", "max_draft_nodes", "max_prompt_tokens", "max_sessions"]
    KV_SLOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    kv_slots: int
    max_batch: int
    max_context: int
    max_draft_nodes: int
    max_prompt_tokens: int
    max_sessions: int
    def __init__(self, max_draft_nodes: _Optional[int] = ..., max_context: _Optional[int] = ..., max_batch: _Optional[int] = ..., kv_slots: _Optional[int] = ..., max_sessions: _Optional[int] = ..., max_prompt_tokens: _Optional[int] = ...) -> None: ...

class MemoryInfo(_message.Message):
    __slots__ = ["device_bytes", "kv_bytes_per_token", "kv_cache_bytes", "kv_tokens", "planned_before_kv_bytes", "used_before_kv_bytes", "weight_bytes", "workspace_bytes"]
    DEVICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_BEFORE_KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BEFORE_KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_BYTES_FIELD_NUMBER: _ClassVar[int]
    device_bytes: int
    kv_bytes_per_token: int
    kv_cache_bytes: int
    kv_tokens: int
    planned_before_kv_bytes: int
    used_before_kv_bytes: int
    weight_bytes: int
    workspace_bytes: int
    def __init__(self, device_bytes: _Optional[int] = ..., weight_bytes: _Optional[int] = ..., workspace_bytes: _Optional[int] = ..., kv_cache_bytes: _Optional[int] = ..., kv_bytes_per_token: _Optional[int] = ..., kv_tokens: _Optional[int] = ..., used_before_kv_bytes: _Optional[int] = ..., planned_before_kv_bytes: _Optional[int] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ["hidden_size", "intermediate_size", "kv_lora_rank", "max_position_embeddings", "name", "num_attention_heads", "num_hidden_layers", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "vocab_size"]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    INTERMEDIATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    MAX_POSITION_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_ATTENTION_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_HIDDEN_LAYERS_FIELD_NUMBER: _ClassVar[int]
    QK_NOPE_HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    QK_ROPE_HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    Q_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    V_HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    hidden_size: int
    intermediate_size: int
    kv_lora_rank: int
    max_position_embeddings: int
    name: str
    num_attention_heads: int
    num_hidden_layers: int
    q_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    vocab_size: int
    def __init__(self, name: _Optional[str] = ..., vocab_size: _Optional[int] = ..., hidden_size: _Optional[int] = ..., num_hidden_layers: _Optional[int] = ..., num_attention_heads: _Optional[int] = ..., q_lora_rank: _Optional[int] = ..., kv_lora_rank: _Optional[int] = ..., qk_nope_head_dim: _Optional[int] = ..., qk_rope_head_dim: _Optional[int] = ..., v_head_dim: _Optional[int] = ..., intermediate_size: _Optional[int] = ..., max_position_embeddings: _Optional[int] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ["hidden_states", "prefix_session_id", "prompt_tokens", "sampling", "top_logprobs"]
    HIDDEN_STATES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    hidden_states: HiddenStatesRequest
    prefix_session_id: str
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    top_logprobs: int
    def __init__(self, prompt_tokens: _Optional[_Iterable[int]] = ..., prefix_session_id: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., top_logprobs: _Optional[int] = ..., hidden_states: _Optional[_Union[HiddenStatesRequest, _Mapping]] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ["committed_len", "hidden_states", "logprobs", "next_token", "session_id"]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_STATES_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    committed_len: int
    hidden_states: HiddenStates
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    next_token: int
    session_id: str
    def __init__(self, session_id: _Optional[str] = ..., next_token: _Optional[int] = ..., committed_len: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., hidden_states: _Optional[_Union[HiddenStates, _Mapping]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ["seed", "temperature", "top_k", "top_p"]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    seed: int
    temperature: float
    top_k: int
    top_p: float
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class SessionStats(_message.Message):
    __slots__ = ["accepted_by_depth", "accepted_tokens", "draft_tokens", "rounds"]
    ACCEPTED_BY_DEPTH_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    accepted_by_depth: _containers.RepeatedScalarFieldContainer[int]
    accepted_tokens: int
    draft_tokens: int
    rounds: int
    def __init__(self, rounds: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., accepted_by_depth: _Optional[_Iterable[int]] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ["logprob", "token", "top_logprobs", "top_tokens"]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    token: int
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    top_tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token: _Optional[int] = ..., logprob: _Optional[float] = ..., top_tokens: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class TruncateSessionRequest(_message.Message):
    __slots__ = ["committed_len", "session_id"]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    committed_len: int
    session_id: str
    def __init__(self, session_id: _Optional[str] = ..., committed_len: _Optional[int] = ...) -> None: ...

class TruncateSessionResponse(_message.Message):
    __slots__ = ["committed_len", "next_token"]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    committed_len: int
    next_token: int
    def __init__(self, next_token: _Optional[int] = ..., committed_len: _Optional[int] = ...) -> None: ...

class VerifyItem(_message.Message):
    __slots__ = ["draft_probs", "expected_committed_len", "request_id", "session_id", "tree"]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    draft_probs: _containers.RepeatedScalarFieldContainer[float]
    expected_committed_len: int
    request_id: str
    session_id: str
    tree: DraftTree
    def __init__(self, session_id: _Optional[str] = ..., tree: _Optional[_Union[DraftTree, _Mapping]] = ..., request_id: _Optional[str] = ..., expected_committed_len: _Optional[int] = ..., draft_probs: _Optional[_Iterable[float]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ["items"]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[VerifyItem]
    def __init__(self, items: _Optional[_Iterable[_Union[VerifyItem, _Mapping]]] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[VerifyResult]
    def __init__(self, results: _Optional[_Iterable[_Union[VerifyResult, _Mapping]]] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ["accepted_nodes", "accepted_tokens", "bonus_token", "committed_len", "hidden_states", "logprobs", "session_id", "stats"]
    ACCEPTED_NODES_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BONUS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_STATES_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    accepted_nodes: _containers.RepeatedScalarFieldContainer[int]
    accepted_tokens: _containers.RepeatedScalarFieldContainer[int]
    bonus_token: int
    committed_len: int
    hidden_states: HiddenStates
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    session_id: str
    stats: SessionStats
    def __init__(self, session_id: _Optional[str] = ..., accepted_nodes: _Optional[_Iterable[int]] = ..., accepted_tokens: _Optional[_Iterable[int]] = ..., bonus_token: _Optional[int] = ..., committed_len: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., hidden_states: _Optional[_Union[HiddenStates, _Mapping]] = ..., stats: _Optional[_Union[SessionStats, _Mapping]] = ...) -> None: ...

class HiddenDtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
