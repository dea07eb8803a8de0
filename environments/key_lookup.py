"""A task solved only through a tool: the question names a key, the value stored under
it is hidden, and the `get` tool is the one way to learn it. Rows come from
`data.synthetic:key_lookup_split`; configs/ppo_tiny_tools_cpu.py trains on it.

An episode: the model calls `get(key)` and reads the value in the tool's answer; a turn
without tool calls is its final answer, rewarded 1.0 when it is the value, else 0.0.
"""

from __future__ import annotations

from typing import Any

from environments.protocol import EnvRow, Reset, Step

GET_TOOL = {
    "type": "function",
    "function": {
        "name": "get",
        "description": "The value stored under a key.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    },
}


class KeyLookup:
    """One episode over one row: `reset`, then `step` once per assistant turn."""

    def __init__(self) -> None:
        self.key = ""
        self.value = ""

    def reset(self, row: EnvRow, seed: int) -> Reset:
        if not isinstance(row.metadata.get("key"), str) or not isinstance(row.reference, str):
            raise ValueError(
                f"key lookup row {row.row_id} ({row.source or 'no source'}) needs a string 'key' and a string "
                f"'reference' (the hidden value), as data.synthetic:key_lookup_split writes them; got key "
                f"{row.metadata.get('key')!r}, reference {row.reference!r}"
            )
        self.key, self.value = row.metadata["key"], row.reference
        prompt = row.prompt if isinstance(row.prompt, list) else [{"role": "user", "content": row.prompt}]
        return Reset(messages=prompt, tools=[GET_TOOL])

    def step(self, assistant_message: dict[str, Any]) -> Step:
        calls = assistant_message.get("tool_calls") or []
        if calls:
            return Step(messages=[self._call(call) for call in calls], reward=0.0, done=False)
        answer = (assistant_message.get("content") or "").strip()
        return Step(messages=[], reward=1.0 if answer == self.value else 0.0, done=True)

    def _call(self, call: dict[str, Any]) -> dict[str, Any]:
        function = call.get("function", call)
        name, arguments = function.get("name"), function.get("arguments")
        # A wrong call is answered, not raised: the model learns from the reply.
        if name != "get":
            content = f"error: no tool {name}, only get(key)"
        elif not isinstance(arguments, dict) or set(arguments) != {"key"}:
            content = "error: get takes one argument, key"
        elif arguments["key"] != self.key:
            content = f"error: no key {arguments['key']}"
        else:
            content = self.value
        return {"role": "tool", "name": str(name), "content": content}


def make_environment() -> KeyLookup:
    """`rl.env.factory`: a fresh environment for each episode."""
    return KeyLookup()
