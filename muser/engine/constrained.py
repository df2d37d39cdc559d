"""Constrained decoding: a grammar decides which tokens may come next (llguidance).

Owns: `Grammar` (what a request asks for: a JSON schema, any JSON object, a
Lark grammar, a regex or a list of choices -- with the request field it came
from, so a refusal names it), `Grammars` (one per tokenizer: the llguidance
tokenizer, built once, and the check that turns a `Grammar` into llguidance's
grammar text or a `ParameterError`) and `Constraint` (one matcher per
generation: the allowed-token mask over the model's vocabulary, consuming a
token, validating drafts, rolling back with the cache).
Does not own: sampling (sampling.py / picker.py) or when a request ends
(the caller reads `Constraint.stopped`).

Why llguidance: measured against xgrammar and outlines-core on the 262,144-token
Gemma vocabulary (benchmarks/grammar_engines.py, figures in
benchmarks/NOTES.md) it computes a mask in ~0.02 ms median, compiles a schema
in ~1-11 ms, has no dependencies of its own (no second torch, no triton), and
rolls a matcher back by token count -- what speculative decoding needs.

Masks: llguidance writes one bit per token (int32 words); `allowed()` unpacks
them to a bool vector of the model's vocabulary (ids past the tokenizer's
vocabulary are never allowed).  End-of-sequence ids are allowed exactly when
the grammar accepts; `stopped` is true once the grammar admits nothing more
(the caller ends the generation with finish_reason "stop" without sampling).
"""
from __future__ import annotations

import functools
import json
import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import ParameterError

KINDS = ("json_schema", "json_object", "lark", "regex", "choice")
# One JSON layout: `{"a": 1, "b": [2, 3]}` -- no free whitespace, which a model can otherwise
# fill until max_tokens (a schema's "x-guidance" cannot turn this off: overrides win).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_GRAMMAR_CHARS = 1 << 20      # grammar / schema source, before compiling


@dataclass(frozen=True)
class Grammar:
    """A request's constraint.  `source`: the schema as JSON text (json_schema), the grammar
    text (lark: llguidance's Lark dialect or llama.cpp's GBNF; regex) or a JSON list of strings (choice); unused for json_object.
    `param`: the request field it came from (named in every refusal)."""

    kind: str
    source: str = ""
    param: str = "response_format"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ParameterError(self.param, f"grammar kind must be one of {KINDS}, got {self.kind!r}")
        if len(self.source) > MAX_GRAMMAR_CHARS:
            raise ParameterError(self.param, f"grammar source of {len(self.source)} characters "
                                             f"exceeds the limit of {MAX_GRAMMAR_CHARS}")

    @staticmethod
    def json_schema(schema: dict, param: str = "response_format.json_schema.schema") -> "Grammar":
        if not isinstance(schema, dict):
            raise ParameterError(param, f"a JSON schema must be an object, got {type(schema).__name__}")
        return Grammar("json_schema", json.dumps(schema, sort_keys=True), param)

    def lark_text(self) -> str:
        """The grammar as llguidance's Lark dialect (a top-level rule `start`)."""
        import llguidance as llg
        if self.kind == "json_object":
            return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_LAYOUT)
        if self.kind == "json_schema":
            return llg.LLMatcher.grammar_from_json_schema(self.source, overrides=JSON_LAYOUT)
        if self.kind == "lark":                        # Lark, or GBNF (llama.cpp) converted to it
            return llg.grammar_from("grammar", self.source)
        if self.kind == "regex":
            return llg.LLMatcher.grammar_from_regex(self.source)
        try:
            options = json.loads(self.source)
        except ValueError:
            options = None
        if not (isinstance(options, list) and options and all(isinstance(o, str) and o for o in options)):
            raise ParameterError(self.param, "choice must be a non-empty list of non-empty strings")
        return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in options))


class Grammars:
    """Compiles `Grammar`s for one tokenizer.  Building the llguidance tokenizer reads the whole
    vocabulary (~3 s for Gemma's 262,144 tokens), so it happens once, on first use."""

    def __init__(self, hf_tokenizer, vocab_size: int, eos_ids: Sequence[int]):
        self._hf, self.vocab_size = hf_tokenizer, int(vocab_size)
        self.eos_ids = tuple(int(i) for i in eos_ids)
        self._tok = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self):
        with self._lock:
            if self._tok is None:
                import llguidance.hf
                self._tok = llguidance.hf.from_tokenizer(self._hf, n_vocab=self.vocab_size,
                                                         eos_token=list(self.eos_ids))
            return self._tok

    def check(self, grammar: Grammar) -> str:
        """llguidance's grammar text for `grammar`, or ParameterError naming the field and why."""
        return _checked(self, grammar)

    def constraint(self, grammar: Grammar) -> "Constraint":
        import llguidance as llg
        text = self.check(grammar)
        m = llg.LLMatcher(self.tokenizer, text, log_level=0)
        if m.is_error():
            raise ParameterError(grammar.param, f"the grammar was refused: {_short(m.get_error())}")
        return Constraint(m, self.vocab_size, self.eos_ids)


@functools.lru_cache(maxsize=256)
def _checked(grammars: Grammars, grammar: Grammar) -> str:
    import llguidance as llg
    try:
        text = grammar.lark_text()
    except ParameterError:
        raise
    except (ValueError, TypeError) as e:
        raise ParameterError(grammar.param, f"not a usable {grammar.kind}: {_short(str(e))}") from None
    bad, msgs = llg.LLMatcher.validate_grammar_with_warnings(text, grammars.tokenizer)
    if bad:
        raise ParameterError(grammar.param, f"unsupported or invalid {grammar.kind}: "
                                            f"{_short(msgs[0] if msgs else 'refused')}")
    return text


def _short(msg: str, limit: int = 400) -> str:
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= limit else msg[:limit] + " ..."


class Constraint:
    """One generation's matcher.  Tokens go in through `accept` (or `accept_drafts`), come back
    out through `rollback`; `allowed()` is the mask for the next token."""

    def __init__(self, matcher, vocab_size: int, eos_ids: Sequence[int] = ()):
        self.m = matcher
        self.vocab_size = vocab_size
        self.eos_ids = frozenset(eos_ids)       # what the grammar admits as "the end"
        self._words = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)   # [words]
        self.consumed = 0

    def fork(self) -> "Constraint":
        c = Constraint(self.m.deep_copy(), self.vocab_size, self.eos_ids)
        c.consumed = self.consumed
        return c

    @property
    def stopped(self) -> bool:
        """Nothing but end-of-sequence can follow: the generation is complete."""
        return self.m.is_stopped()

    @property
    def accepting(self) -> bool:
        return self.m.is_accepting()

    def _bits(self) -> np.ndarray:
        w = self._words
        self.m.unsafe_compute_mask_ptr(w.data_ptr(), w.numel() * 4)
        return np.unpackbits(w.numpy().view(np.uint8), bitorder="little")[:self.vocab_size]

    def allowed(self) -> torch.Tensor:
        """bool [vocab]: the tokens the grammar admits next."""
        return torch.from_numpy(self._bits().view(np.bool_))

    def apply(self, scores: torch.Tensor) -> torch.Tensor:
        """`scores` (float32 [vocab], contiguous, CPU) with every token the grammar refuses set
        to -inf, in place.  numpy on purpose: one thread, no wake-up of torch's thread pool,
        which on a busy 2-core machine costs more than the whole mask (benchmarks/NOTES.md)."""
        np.copyto(scores.numpy(), -np.inf, where=self._bits() == 0)
        return scores

    def accept(self, token: int) -> None:
        if not self.m.consume_token(int(token)):
            raise ParameterError("grammar", f"token {token} was refused by the grammar: "
                                            f"{_short(self.m.get_error())}")
        self.consumed += 1

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` the grammar would accept from here (state unchanged)."""
        return self.m.validate_tokens([int(t) for t in tokens]) if tokens else 0

    def rollback(self, n: int) -> None:
        """Forget the last `n` accepted tokens (a speculative block's rejected drafts)."""
        if n:
            if n > self.consumed or not self.m.rollback(n):
                raise ParameterError("grammar", f"cannot roll the matcher back {n} tokens "
                                                f"(it consumed {self.consumed})")
            self.consumed -= n
