"""Writes the example traces: `python examples/traces/generate.py` (deterministic).

One coding-agent session per wire format, told once (STEPS) and rendered in each: huge tool
results (offloaded), parallel calls, an interruption that leaves a call unanswered (repaired),
and enough reading to fill the demo's 8,192-token window (a summary).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEM = "You are a coding agent working in the todo-app repository. Use the tools."
TOOLS = [
    ("read_file", "Read a file of the repository", {"path": {"type": "string"}}),
    ("run_tests", "Run the test suite and print its output", {"filter": {"type": "string"}}),
    ("grep", "Search the repository", {"pattern": {"type": "string"}}),
    ("write_file", "Write a file", {"path": {"type": "string"}, "content": {"type": "string"}}),
]


def module(name: str, lines: int) -> str:
    body = [f'"""{name}: part of the todo app."""', "", "import json", ""]
    for i in range(lines):
        body.append(f"def {name}_step_{i}(items, limit={i}):")
        body.append(f"    return [item for item in items if item.get('rank', 0) < limit + {i}]")
    return "\n".join(body)


def test_log(failures: int, lines: int) -> str:
    out = [f"tests/test_todo.py::test_case_{i} PASSED [{i * 100 // lines:3d}%]" for i in range(lines)]
    for i in range(failures):
        out[lines // 2 + i] = (
            f"tests/test_todo.py::test_case_{lines // 2 + i} FAILED - AssertionError: "
            f"expected 'done' got 'open' (todo id {i})"
        )
    return "\n".join(out) + f"\n{failures} failed, {lines - failures} passed"


def call(name: str, **args: Any) -> tuple[str, dict[str, Any]]:
    return name, args


# Each step: (what the client adds: a user text, or tool outputs for the previous calls;
#             the model's answer: a text, or calls).
STEPS: list[tuple[Any, Any]] = [
    ("The test suite fails since yesterday. Find out why and fix it.",
     [call("run_tests", filter=""), call("read_file", path="app.py")]),
    (["@log", "@app"], [call("grep", pattern="status = 'open'")]),
    (["app.py:41: status = 'open'\nstore.py:12: status = 'open'"],
     [call("read_file", path=f"todo/{n}.py") for n in ("store", "models", "views")]),
    (["@store", "@models", "@views"],
     [call("read_file", path=f"todo/{n}.py") for n in ("api", "cli", "sync")]),
    (["@api", "@cli", "@sync"],
     [call("read_file", path=f"todo/{n}.py") for n in ("auth", "export", "search")]),
    (["@auth", "@export", "@search"],
     [call("write_file", path="todo/store.py", content="# fixed\n" + module("store", 6))]),
    # The agent crashed here: write_file never got its result, the user resumes.
    ("Sorry, my terminal crashed. Where were we?",
     "We were fixing the status default in todo/store.py; I will run the tests again."),
    ("Yes, run the tests.", [call("run_tests", filter="todo")]),
    (["@log2"], "All tests pass now: the default status was 'open' where 'done' was expected."),
]

OUTPUTS = {
    "@log": test_log(3, 700),
    "@log2": test_log(0, 700),
    "@app": module("app", 8),
    **{f"@{n}": module(n, 11) for n in
       ("store", "models", "views", "api", "cli", "sync", "auth", "export", "search")},
}


def conversation() -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """(history sent, answer) per turn, chat-shaped, with call ids."""
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    turns = []
    calls: list[dict[str, Any]] = []
    for number, (added, answer) in enumerate(STEPS, 1):
        if isinstance(added, str):
            history.append({"role": "user", "content": added})
        else:
            for pending, output in zip(calls, added, strict=True):
                history.append({"role": "tool", "tool_call_id": pending["id"],
                                "content": OUTPUTS.get(output, output)})
        if isinstance(answer, str):
            message: dict[str, Any] = {"role": "assistant", "content": answer}
            calls = []
        else:
            calls = [{"id": f"call_{number:02d}_{i}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args)}}
                     for i, (name, args) in enumerate(answer)]
            message = {"role": "assistant", "content": None, "tool_calls": calls}
        turns.append(([dict(m) for m in history], message))
        history.append(message)
    return turns


def usage_of(history: list[dict[str, Any]], message: dict[str, Any]) -> tuple[int, int]:
    prompt = sum(len(json.dumps(m)) for m in history) // 4
    return prompt, max(1, len(json.dumps(message)) // 4)


def chat_trace(model: str) -> list[dict[str, Any]]:
    tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": {
        "type": "object", "properties": p, "required": list(p)}}} for n, d, p in TOOLS]
    lines = []
    for number, (history, message) in enumerate(conversation(), 1):
        prompt, completion = usage_of(history, message)
        answer = {
            "id": f"chatcmpl-example{number:03d}", "object": "chat.completion",
            "created": 1764800000 + number, "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        }
        lines.append({"wire": "chat", "request": {"model": model, "messages": history,
                                                  "tools": tools}, "answer": answer})
    return lines


def _anthropic_messages(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in history[1:]:
        if m["role"] == "assistant":
            out.append({"role": "assistant", "content": _anthropic_content(m)})
        elif m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if out and out[-1]["role"] == "user" and out[-1]["content"][0]["type"] == "tool_result":
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        else:
            out.append({"role": "user", "content": [{"type": "text", "text": m["content"]}]})
    return out


def _anthropic_content(message: dict[str, Any]) -> list[dict[str, Any]]:
    if message.get("tool_calls"):
        return [{"type": "tool_use", "id": c["id"].replace("call_", "toolu_"),
                 "name": c["function"]["name"], "input": json.loads(c["function"]["arguments"])}
                for c in message["tool_calls"]]
    return [{"type": "text", "text": message["content"]}]


def anthropic_trace(model: str) -> list[dict[str, Any]]:
    tools = [{"name": n, "description": d, "input_schema": {
        "type": "object", "properties": p, "required": list(p)}} for n, d, p in TOOLS]
    lines = []
    for number, (history, message) in enumerate(conversation(), 1):
        prompt, completion = usage_of(history, message)
        history = [dict(m, tool_call_id=m["tool_call_id"].replace("call_", "toolu_"))
                   if m["role"] == "tool" else m for m in history]
        answer = {
            "id": f"msg_example{number:03d}", "type": "message", "role": "assistant",
            "model": model, "content": _anthropic_content(message),
            "stop_reason": "tool_use" if message.get("tool_calls") else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": completion},
        }
        request = {"model": model, "max_tokens": 4096, "system": SYSTEM,
                   "messages": _anthropic_messages(history), "tools": tools}
        lines.append({"wire": "anthropic", "request": request, "answer": answer})
    return lines


def _responses_items(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for m in history[1:]:
        if m["role"] == "assistant":
            items += _responses_output(m, with_ids=False)
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"],
                          "output": m["content"]})
        else:
            items.append({"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": m["content"]}]})
    return items


def _responses_output(message: dict[str, Any], with_ids: bool) -> list[dict[str, Any]]:
    if message.get("tool_calls"):
        return [{"type": "function_call", **({"id": "fc_" + c["id"][5:], "status": "completed"}
                                              if with_ids else {}),
                 "call_id": c["id"], "name": c["function"]["name"],
                 "arguments": c["function"]["arguments"]} for c in message["tool_calls"]]
    text = {"type": "output_text", "text": message["content"], "annotations": []}
    item = {"type": "message", "role": "assistant", "content": [text]}
    return [{**item, "id": "msg_example", "status": "completed"} if with_ids else item]


def responses_trace(model: str) -> list[dict[str, Any]]:
    tools = [{"type": "function", "name": n, "description": d, "parameters": {
        "type": "object", "properties": p, "required": list(p)}} for n, d, p in TOOLS]
    lines = []
    for number, (history, message) in enumerate(conversation(), 1):
        prompt, completion = usage_of(history, message)
        answer = {
            "id": f"resp_example{number:03d}", "object": "response",
            "created_at": 1764800000 + number, "status": "completed", "model": model,
            "output": _responses_output(message, with_ids=True),
            "usage": {"input_tokens": prompt, "output_tokens": completion,
                      "total_tokens": prompt + completion},
        }
        request = {"model": model, "instructions": SYSTEM, "input": _responses_items(history),
                   "tools": tools, "store": False}
        lines.append({"wire": "responses", "request": request, "answer": answer})
    return lines


def main() -> None:
    for name, lines in (
        ("coding-agent-chat.jsonl", chat_trace("gpt-4.1-mini")),
        ("coding-agent-anthropic.jsonl", anthropic_trace("claude-sonnet-4-5")),
        ("coding-agent-responses.jsonl", responses_trace("gpt-5-codex")),
    ):
        with open(HERE / name, "w") as file:
            for line in lines:
                file.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
