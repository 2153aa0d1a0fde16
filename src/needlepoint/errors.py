"""Typed errors: every bad input a user can hand needlepoint maps to one of these."""

from __future__ import annotations


class NeedlepointError(Exception):
    """Base class of every error needlepoint raises on purpose."""


class CactFormatError(NeedlepointError, ValueError):
    """The `.cact` archive is malformed: truncated, corrupt, or inconsistent with its header."""


class TokenizerError(NeedlepointError, ValueError):
    """Bad tokenizer input: a corrupt blob or a token id outside the vocabulary."""


class ModelInputError(NeedlepointError, ValueError):
    """Bad model input: token id out of range, empty or over-long sequence, cache exhausted."""


class ContextLengthError(ModelInputError):
    """A turn's prompt (and the answer budget asked for) cannot fit the model's context:
    `prompt_tokens`, `limit` (max_seq_len) and `max_new_tokens` (None: no budget was asked
    for, the answer is only cut by the context) say by how much."""

    def __init__(self, message: str, *, prompt_tokens: int, limit: int,
                 max_new_tokens: int | None = None) -> None:
        super().__init__(message)
        self.prompt_tokens, self.limit = prompt_tokens, limit
        self.max_new_tokens = max_new_tokens


class ToolSchemaError(NeedlepointError, ValueError):
    """A tool definition cannot be turned into a JSON schema the model and grammar accept."""


class CheckpointError(NeedlepointError, ValueError):
    """A Hugging Face model directory or GGUF file is malformed or cannot be run: a missing or
    unreadable file, a bad config field, a tensor that is missing or has the wrong shape.
    The message names the file, field or tensor."""


class UnsupportedArchitectureError(CheckpointError):
    """The checkpoint's architecture (config `model_type` / GGUF `general.architecture`) or one
    of its options (a RoPE scaling type, an activation, ...) is not one needlepoint runs."""


class MissingTensorError(CheckpointError, KeyError):
    """A tensor the architecture needs is not in the checkpoint (the message names it)."""

    __str__ = BaseException.__str__  # plain message, not KeyError's repr-quoted one


class TensorShapeError(CheckpointError):
    """A tensor's shape does not match the config (the message names it, with both shapes)."""


class UnsupportedTensorTypeError(CheckpointError):
    """A tensor's storage type (a safetensors dtype, a GGUF quantisation type) cannot be
    decoded (the message names the tensor and the type)."""


class GGUFFormatError(CheckpointError):
    """A GGUF file is malformed: a bad header, a truncated directory or payload, a tensor of an
    unknown ggml type, whose shape does not divide into its type's blocks, or whose bytes
    (implied by its type and shape) overlap the next tensor or run past the end of the file.
    The message names the file, the tensor and the byte offset; `tensor` and `offset` hold
    them (None where the fault is in the header)."""

    def __init__(self, message: str, tensor: str | None = None,
                 offset: int | None = None) -> None:
        super().__init__(message)
        self.tensor = tensor
        self.offset = offset


class NonFiniteActivationError(NeedlepointError, ArithmeticError):
    """The model computed NaN or infinite values (logits or activations): almost always
    corrupted weight bytes inside an otherwise well-formed archive
    (`needlepoint inspect --verify MODEL.cact` finds the tensor)."""


class ToolFormatError(NeedlepointError, ValueError):
    """A chat template's tool-call syntax is not one needlepoint knows, or `tool_format`
    names an unknown or unusable one."""


class InvalidOptionError(NeedlepointError, ValueError):
    """A generation option (temperature, top_p, seed, stop, ...) has a wrong type or value;
    the message names the option and what it allows."""


class InvalidQueryError(NeedlepointError, ValueError):
    """The user's query is empty, blank or not a string."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A named model (e.g. "smollm2") whose package or file is not installed."""


class StageError(NeedlepointError, RuntimeError):
    """A pipeline stage of a model cut into stages (`needlepoint.load(path, stages=...)`)
    failed; `stage` is its index (None: the head, or no one stage) and the message names it
    and its layers. `timed_out`: the stage stayed silent past `call_timeout_s` rather than
    dying, so recovery restarts it instead of waiting for Ray to."""

    timed_out = False

    def __init__(self, message: str, stage: int | None = None) -> None:
        super().__init__(message)
        self.stage = stage

    def __reduce__(self):  # picklable with its stage (it crosses process boundaries)
        return (type(self), (str(self), self.stage))


class StageNonFiniteError(StageError, NonFiniteActivationError):
    """Non-finite activations at one end of a hop between stages (sent or received), or
    computed inside a stage; the message names the stage and which end refused them."""


class StageLostError(StageError):
    """A stage process died or stopped answering while it held part of a request: that
    request fails; Ray restarts the actor, and later sessions work once it is back."""


class StageSessionLostError(StageLostError):
    """A session's cache lived on a stage that has restarted since (or the session was
    closed): the session cannot continue; start a new one."""


class StageStartError(StageError):
    """A stage never came up at load (no node offers its placement, its process failed to
    load the archive, or it did not answer in time)."""


class StagePlacementError(StageStartError):
    """The stages' reservations cannot fit the Ray cluster (more CPUs than its nodes offer, or
    a resource / label no node has): raised before any actor starts, naming the numbers and
    the fix (`stage_cpus=`, fewer stages, more nodes)."""


class StagePlanError(StageError, ValueError):
    """Bad stage options: the cut points, stage count, transport or placement are invalid,
    or the model cannot be cut (Needle 2, Hugging Face / GGUF models)."""


class McpConfigError(NeedlepointError, ValueError):
    """An `mcp.json` (the `{"mcpServers": {...}}` form) is malformed: not JSON, not
    an object, a server with neither `command` nor `url`, a field of the wrong type; the
    message names the file and the server."""


class McpServerError(NeedlepointError, RuntimeError):
    """An MCP server did not start, died, or did not answer within its timeout; `server` is
    its name in the `mcp.json`, and the message names it. (A tool that answers with an error
    is not this: that is a tool result the model sees.)"""

    def __init__(self, message: str, server: str | None = None) -> None:
        super().__init__(message)
        self.server = server

    def __reduce__(self):  # picklable with its server name
        return (type(self), (str(self), self.server))
