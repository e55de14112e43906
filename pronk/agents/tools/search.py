"""The `search` tool: BM25-ranked text search over the documents a job ships (`*.md`, `*.txt`).

Each hit shows a snippet of at most `SNIPPET_CHARS`: the passage around the document's sentence that best matches
the query (the most idf of the query's words), as a search engine's result page does. A snippet that was the
document's first 200 characters cut the answer off wherever it came later: "a grammar backend such as xgram" for
vLLM, nothing of the eviction order in the prefix-caching note.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pronk.agents.tools.base import ToolContext, ToolError

WORD = re.compile(r"[a-z0-9]+")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
SNIPPET_CHARS = 200
ELLIPSIS = "…"


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


@dataclass(slots=True)
class Document:
    name: str
    title: str
    text: str
    counts: Counter
    length: int


class SearchTool:
    name = "search"
    description = "Search the document corpus; returns the best-matching documents with a snippet, best first."
    parameters = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "Words to look for", "maxLength": 120},
            "k": {"type": "integer", "minimum": 1, "maximum": 5, "description": "How many documents"},
        },
        "required": ["query"],
        "additionalProperties": False,
    }

    def __init__(self, corpus_dir: Path, k1: float = 1.2, b: float = 0.75):
        self.k1, self.b = k1, b
        self.documents = []
        for path in sorted(p for p in corpus_dir.rglob("*") if p.suffix in {".md", ".txt"}):
            text = path.read_text(errors="replace")
            tokens = words(text)
            title = next((line.lstrip("# ").strip() for line in text.splitlines() if line.strip()), path.stem)
            self.documents.append(Document(path.stem, title, text, Counter(tokens), len(tokens)))
        self.average_length = sum(d.length for d in self.documents) / max(len(self.documents), 1)
        frequency = Counter(term for d in self.documents for term in d.counts)
        n = len(self.documents)
        self.idf = {term: math.log(1 + (n - df + 0.5) / (df + 0.5)) for term, df in frequency.items()}

    def score(self, document: Document, terms: list[str]) -> float:
        total = 0.0
        for term in terms:
            tf = document.counts.get(term, 0)
            if tf:
                norm = tf + self.k1 * (1 - self.b + self.b * document.length / self.average_length)
                total += self.idf[term] * tf * (self.k1 + 1) / norm
        return total

    def snippet(self, document: Document, terms: list[str]) -> str:
        """The passage of `document` around its sentence with the most idf of `terms`: that sentence, then its
        neighbours (the next one first) while the passage fits `SNIPPET_CHARS`, with "…" where it was cut."""
        sentences = SENTENCE_END.split(" ".join(document.text.split()))
        wanted = set(terms)

        def weight(i: int) -> float:
            # summed in a fixed order: a set's order follows the process's hash seed, and float sums its order
            return sum(self.idf.get(term, 0.0) for term in sorted(set(words(sentences[i])) & wanted))

        best = max(range(len(sentences)), key=lambda i: (weight(i), -i))
        first = last = best
        length = len(sentences[best])
        grown = True
        while grown:
            grown = False
            for i in (last + 1, first - 1):
                if 0 <= i < len(sentences) and length + 1 + len(sentences[i]) <= SNIPPET_CHARS:
                    first, last, length, grown = min(first, i), max(last, i), length + 1 + len(sentences[i]), True
        passage = " ".join(sentences[first : last + 1])
        if len(passage) > SNIPPET_CHARS:
            passage = passage[: SNIPPET_CHARS - 2].rsplit(" ", 1)[0] + " " + ELLIPSIS
        elif last < len(sentences) - 1:
            passage += " " + ELLIPSIS
        return f"{ELLIPSIS} {passage}" if first > 0 else passage

    def search(self, query: str, k: int) -> list[tuple[float, Document]]:
        terms = words(query)
        ranked = sorted(((self.score(d, terms), d) for d in self.documents), key=lambda pair: (-pair[0], pair[1].name))
        return [(s, d) for s, d in ranked[:k] if s > 0]

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> str:
        query = arguments.get("query")
        if not isinstance(query, str):
            raise ToolError(f"search: 'query' must be a string, got {query!r}")
        k = arguments.get("k", 3)
        if not isinstance(k, int) or not 1 <= k <= 5:
            raise ToolError(f"search: 'k' must be an integer from 1 to 5, got {k!r}")
        hits = self.search(query, k)
        if not hits:
            return f"no document matches {query!r}"
        terms = words(query)
        lines = []
        for rank, (score, doc) in enumerate(hits, start=1):
            lines.append(f"{rank}. {doc.title} [{doc.name}] score={score:.2f}: {self.snippet(doc, terms)}")
        return "\n".join(lines)
