"""The request and record format llamabatch shares with OpenAI's APIs, for `run`, `serve` and
`serve-stdin` alike: one line or body in (plain JSONL, OpenAI Batch lines, chat, completions
and embeddings bodies), one record out. Pure functions and dataclasses: no I/O, no model.

jobs/ and serve/ import the names below, never the modules behind them (tests/test_layering.py):
  lines.py          parse a line or body (LineParser) and build its record
  request_body.py   an OpenAI body's fields read into a prompt and sampling fields (for lines.py)
  logprobs.py       OpenAI's logprobs shapes from a result's token logprobs
  embed_records.py  embeddings lines and records; embed_vectors.py the vectors' encodings
  fields.py         the field checks serve-stdin's requests share with lines
  responses_request.py, responses_object.py  a /v1/responses body as a chat turn; the response object
  responses_input.py, responses_tools.py  its input items (messages, function calls and their outputs);
                    its function tools and function_call output items
  tools_request.py, tool_turns.py, tool_lines.py  a chat request's tools, tool turns and call grammar
  tool_calls.py     the calls read out of an answer (whole or streamed) in OpenAI's shape
  ignored_fields.py documented fields with no local effect, named in records (and a header online)
  tool_library.py   with_tools / tool_message: the same around Engine.submit, for the library
  reasoning.py      a thinking answer's reasoning_content and reasoning_tokens in OpenAI's shapes
"""
from .embed_records import EmbedLine
from .embed_vectors import check_encoding, encode as encode_vector
from .fields import check_messages, check_prompt, is_int, is_request_id, json_kind
from .lines import (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, OPENAI, URLS, LineError, LineParser,
                    LineRequest, build_record, duplicate_id_error, error_result, failed, is_unnamed_error,
                    record_error_code, record_id)
from .responses_object import (assistant_turn, message_item, new_message_id, new_reasoning_id, new_response_id,
                               output_text, output_text_part, reasoning_item, reasoning_text, reasoning_text_part,
                               response_object)
from .responses_tools import function_call_item
from .ignored_fields import header_for as ignored_fields_header
from .responses_request import RESPONSES_URL, ResponsesRequest, take_online_fields
from .reasoning import usage_details, with_reasoning
from .tool_calls import (ToolCallSplitter, arguments_text, chat_message, new_call_id, openai_call, plain_tool_fields, result_tool_fields,
                         split_tool_calls)
from .tool_library import tool_message, with_tools
from .tool_lines import chat_with_tools
from .tools_request import TOOL_BODY_FIELDS, TOOLS_MESSAGE_ROLE, Tool, ToolRequest, parse_tools, tools_message

__all__ = [
    "usage_details", "with_reasoning", "arguments_text",
    "CHAT_URL", "COMPLETIONS_URL", "EMBEDDINGS_URL", "OPENAI", "URLS", "EmbedLine", "LineError", "LineParser",
    "LineRequest", "build_record", "check_encoding", "check_messages", "check_prompt", "duplicate_id_error",
    "encode_vector", "error_result", "failed", "is_int", "is_request_id", "is_unnamed_error", "json_kind",
    "record_error_code", "record_id", "RESPONSES_URL", "ResponsesRequest", "message_item", "new_message_id",
    "new_response_id", "new_reasoning_id", "reasoning_item", "reasoning_text", "reasoning_text_part", "output_text", "assistant_turn", "function_call_item", "output_text_part", "response_object", "take_online_fields",
    "TOOL_BODY_FIELDS", "TOOLS_MESSAGE_ROLE", "Tool", "chat_with_tools", "openai_call", "plain_tool_fields", "result_tool_fields", "ToolCallSplitter", "ToolRequest", "chat_message", "new_call_id", "parse_tools",
    "ignored_fields_header", "split_tool_calls", "tool_message", "tools_message", "with_tools",
]
