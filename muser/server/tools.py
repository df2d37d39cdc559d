"""Function calling: rendering tools into the prompt, constraining calls, parsing them back.

Owns: the prompt format for models whose chat template has no tool calling (Gemma 3):
the tool definitions go into the system prompt, a call is written as

    <tool_call>
    {"name": "NAME", "arguments": {...}}
    </tool_call>

(one block per call, blocks separated by a newline), and results come back as a user
turn of `<tool_response>` blocks; the grammar that makes `tool_choice` "required" or a
named function always produce valid calls (each function's `parameters` schema is the
arguments' schema); parsing the calls out of the text (also for "auto", unconstrained);
and `ToolStream`, which turns text deltas into OpenAI's streamed tool-call deltas.
This format is used for every model, also one whose own template defines tool calling
(rendering through such templates is not wired yet); the block format is the Hermes /
Qwen convention, so models trained on it follow it.
Does not own: request validation (schemas.py) or the response shapes (responses.py).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from ..engine.constrained import JSON_LAYOUT, Grammar
from ..errors import ParameterError

OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"
HEAD = '{"name": '
ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class ToolSet:
    """The request's functions and what it asked for."""

    functions: tuple[dict, ...]              # [{"name", "description", "parameters"}]
    choice: str                              # "none" | "auto" | "required" | "named"
    named: str | None = None
    parallel: bool = True

    @property
    def active(self) -> bool:
        return bool(self.functions) and self.choice != "none"

    @property
    def constrained(self) -> bool:
        return self.active and self.choice in ("required", "named")

    def schema(self, name: str) -> dict:
        for f in self.functions:
            if f["name"] == name:
                return f["parameters"]
        raise KeyError(name)


def toolset(req) -> ToolSet | None:
    """The `ToolSet` of a validated chat request, or None without tools."""
    if not req.tools:
        return None
    fns, seen = [], set()
    for i, t in enumerate(req.tools):
        f = t.function
        if f.name in seen:
            raise ParameterError(f"tools[{i}].function.name", f"duplicate function name {f.name!r}")
        seen.add(f.name)
        fns.append({"name": f.name, "description": f.description or "",
                    "parameters": f.parameters if f.parameters is not None else ANY_OBJECT})
    tc = req.tool_choice
    choice, named = ("auto", None) if tc is None else (tc, None) if isinstance(tc, str) \
        else ("named", tc.function.name)
    if named is not None and named not in seen:
        raise ParameterError("tool_choice.function.name", f"{named!r} is not among the tools "
                                                          f"({', '.join(sorted(seen))})")
    return ToolSet(tuple(fns), choice, named, req.parallel_tool_calls is not False)


def check_schemas(tools: ToolSet, grammars) -> None:
    """Every function's parameters must compile as a JSON schema (400 naming the tool)."""
    for i, f in enumerate(tools.functions):
        grammars.check(Grammar.json_schema(f["parameters"], f"tools[{i}].function.parameters"))


def _inline(schema: dict) -> str:
    return json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def grammar(tools: ToolSet) -> Grammar:
    """Lark grammar (llguidance dialect): one call or, with parallel_tool_calls, one or more."""
    names = [tools.named] if tools.choice == "named" else [f["name"] for f in tools.functions]
    bodies = []
    for i, name in enumerate(names):
        head = json.dumps(f'{HEAD}{json.dumps(name)}, "arguments": ')
        bodies.append(f"f{i}: {head} %json {_inline(tools.schema(name))} \"}}\"")
    start = "start: call (\"\\n\" call)*" if tools.parallel else "start: call"
    text = "\n".join([start, f"call: {json.dumps(OPEN)} body {json.dumps(CLOSE)}",
                      "body: " + " | ".join(f"f{i}" for i in range(len(names))), *bodies])
    return Grammar("lark", text, "tools")


# ----------------------------------------------------------------------------- prompt
def system_text(tools: ToolSet) -> str:
    lines = ["You may call these functions (\"parameters\" is the JSON schema of the arguments):"]
    lines += [json.dumps({k: v for k, v in f.items() if v}, ensure_ascii=False, separators=(",", ":"))
              for f in tools.functions]
    how = "one or more blocks" if tools.parallel else "one block"
    lines.append(f"To call, answer with {how} like this and nothing else:")
    lines.append(f'{OPEN}{{"name": "NAME", "arguments": {{...}}}}{CLOSE}')
    lines.append("Results come back in <tool_response> blocks.")
    if tools.choice == "required":
        lines.append("You must call at least one function now.")
    elif tools.choice == "named":
        lines.append(f"You must call the function {tools.named!r} now.")
    return "\n".join(lines)


def render_messages(messages, tools: ToolSet | None) -> list[dict]:
    """Plain {role, content} messages for a template without tool calling: tool
    definitions join the system prompt, assistant tool calls become call blocks, and
    runs of tool results (and a user message right after them) become one user turn."""
    out: list[dict] = []
    if tools is not None and tools.active:
        sys_text = system_text(tools)
        if messages and messages[0].role in ("system", "developer"):
            first = messages[0].text()
            out.append({"role": "system", "content": f"{first}\n\n{sys_text}" if first else sys_text})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": sys_text})
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            blocks = [f'{OPEN}{{"name": {json.dumps(c.function.name)}, "arguments": '
                      f'{c.function.arguments}}}{CLOSE}' for c in m.tool_calls]
            text = (m.text() + "\n" if m.text() else "") + "\n".join(blocks)
            out.append({"role": "assistant", "content": text})
        elif m.role == "tool":
            block = f"<tool_response>\n{m.text()}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        elif m.role == "user" and out and out[-1].get("_tool"):
            out[-1]["content"] += "\n\n" + m.text()
        else:
            out.append(m.plain())
    for m in out:
        m.pop("_tool", None)
    return out


# ----------------------------------------------------------------------------- parsing
def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_calls(text: str, tools: ToolSet, truncated: bool = False) -> tuple[str | None, list[dict]]:
    """(content before the first call or None, [{"name", "arguments" (JSON text)}]); no calls
    when any block is malformed, names an unknown function, or its arguments fail the schema.
    `truncated` (the generation hit max_tokens): an unfinished last block is dropped and the
    complete ones before it are returned."""
    import jsonschema
    at = text.find(OPEN.strip())
    if at < 0:
        return text, []
    content, rest, calls = text[:at].strip() or None, text[at:], []
    dec = json.JSONDecoder()
    while rest.strip():
        rest = rest.lstrip()
        if truncated and calls and CLOSE.strip() not in rest:
            break                                  # the unfinished last block
        if not rest.startswith(OPEN.strip()):
            return text, []
        body = rest[len(OPEN.strip()):].lstrip()
        try:
            obj, end = dec.raw_decode(body)
        except ValueError:
            return text, []
        rest = body[end:].lstrip()
        if not rest.startswith(CLOSE.strip()):
            return text, []
        rest = rest[len(CLOSE.strip()):]
        if not (isinstance(obj, dict) and isinstance(obj.get("arguments"), dict)):
            return text, []
        try:
            jsonschema.validate(obj["arguments"], tools.schema(obj.get("name")))
        except (KeyError, jsonschema.ValidationError, jsonschema.SchemaError):
            return text, []
        calls.append({"name": obj["name"], "arguments": json.dumps(obj["arguments"], ensure_ascii=False)})
    return content, calls


@dataclass
class ToolStream:
    """Text deltas of one choice -> OpenAI chat deltas.  Constrained choices ("required",
    named) stream each call's arguments as they are generated; "auto" streams content
    until a call block may begin, holds the rest, and at the end emits either complete
    calls or the held text as content."""

    tools: ToolSet
    text: str = ""
    sent: int = 0                    # characters of `text` already turned into deltas
    calls: int = 0                   # tool calls opened so far
    ids: list = field(default_factory=list)

    def push(self, delta: str) -> list[dict]:
        self.text += delta
        if self.tools.constrained:
            return self._constrained()
        marker = OPEN.strip()
        head = self.text[self.sent:]
        at = head.find(marker)
        if at < 0:                        # keep back what could be the start of the marker
            keep = next((k for k in range(min(len(marker) - 1, len(head)), 0, -1)
                         if marker.startswith(head[-k:])), 0)
            at = len(head) - keep
        if at <= 0:
            return []
        self.sent += at
        return [{"content": head[:at]}]

    def _constrained(self) -> list[dict]:
        out = []
        while True:
            rest = self.text[self.sent:]
            if self.calls == len(self.ids):          # between calls: wait for a whole header
                start = rest.find(OPEN + HEAD)
                if start < 0:
                    return out
                after = rest[start + len(OPEN + HEAD):]
                try:
                    name, end = json.JSONDecoder().raw_decode(after)
                except ValueError:
                    return out
                sep = ', "arguments": '
                if not after[end:].startswith(sep):
                    return out
                cid = new_call_id()
                self.ids.append(cid)
                self.sent += start + len(OPEN + HEAD) + end + len(sep)
                out.append({"tool_calls": [{"index": len(self.ids) - 1, "id": cid, "type": "function",
                                            "function": {"name": name, "arguments": ""}}]})
                continue
            tail = "}" + CLOSE
            end = rest.find(tail)
            chunk = rest[:end] if end >= 0 else rest[:max(0, len(rest) - len(tail) + 1)]
            if chunk:
                self.sent += len(chunk)
                out.append({"tool_calls": [{"index": len(self.ids) - 1,
                                            "function": {"arguments": chunk}}]})
            if end < 0:
                return out
            self.sent += len(tail)
            self.calls += 1

    def finish(self) -> tuple[list[dict], bool]:
        """(the last deltas, whether the choice ended in tool calls)."""
        if self.tools.constrained:
            return [], self.calls > 0 and self.calls == len(self.ids)
        content, calls = parse_calls(self.text[self.sent:], self.tools)
        if not calls:
            rest = self.text[self.sent:]
            return ([{"content": rest}] if rest else []), False
        out = [{"content": content}] if content else []
        for i, c in enumerate(calls):
            out.append({"tool_calls": [{"index": i, "id": new_call_id(), "type": "function",
                                        "function": {"name": c["name"], "arguments": c["arguments"]}}]})
        return out, True
