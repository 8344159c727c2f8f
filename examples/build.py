"""Regenerate the example batches: `python3 examples/build.py` (stdlib only).

The JSONL files are generated from this readable source so the code inside them stays
editable; tests/unit/test_examples.py checks that the committed files match it.

Every job carries labels: ``suite``, ``task`` and ``expect`` (the status it should end
with); the batch summary compares ``expect`` with what came back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from textwrap import dedent

HERE = Path(__file__).resolve().parent
PYTEST = "python3 -m pytest -q"
# How agents usually look at test output mid-trajectory: piped, so the step itself exits 0.
PEEK = f"{PYTEST} 2>&1 | tail -n 25"


def src(text: str) -> str:
    return dedent(text).lstrip("\n")


def write(path: str, content: str) -> dict:
    return {"kind": "write_file", "path": path, "content": src(content)}


def bash(command: str) -> dict:
    return {"kind": "bash", "command": command}


def python(code: str) -> dict:
    return {"kind": "python", "code": src(code)}


def read(path: str) -> dict:
    return {"kind": "read_file", "path": path}


def trajectory(task: str, expect: str, steps: list[dict], **extra) -> dict:
    job = {"steps": steps, "labels": {"suite": "trajectories", "task": task, "expect": expect}}
    limits = extra.pop("limits", None)
    job.update(extra)
    job["limits"] = {"timeout_s": 20, "memory_mb": 512, **(limits or {})}
    return job


# ------------------------------------------------------------------ trajectories

TRAJECTORIES = [
    trajectory(
        "slugify",
        "succeeded",
        [
            write(
                "textutil.py",
                """
                import re

                def slugify(text):
                    return re.sub(r"\\s+", "-", text.strip().lower())
                """,
            ),
            write(
                "test_textutil.py",
                """
                from textutil import slugify

                def test_spaces():
                    assert slugify("Hello World") == "hello-world"

                def test_punctuation():
                    assert slugify("Hello, World!") == "hello-world"

                def test_collapses_dashes():
                    assert slugify("a -- b") == "a-b"
                """,
            ),
            bash(PEEK),
            write(
                "textutil.py",
                """
                import re

                def slugify(text):
                    words = re.findall(r"[a-z0-9]+", text.lower())
                    return "-".join(words)
                """,
            ),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "roman-numerals",
        "succeeded",
        [
            write(
                "roman.py",
                """
                PAIRS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"),
                         (90, "XC"), (50, "L"), (40, "XL"), (10, "X"), (9, "IX"),
                         (5, "V"), (4, "IV"), (1, "I")]

                def to_roman(n):
                    out = ""
                    for value, letters in PAIRS:
                        while n >= value:
                            out += letters
                            n -= value
                    return out

                def from_roman(s):
                    total, i = 0, 0
                    for value, letters in PAIRS:
                        while s.startswith(letters, i):
                            total += value
                            i += len(letters)
                    return total
                """,
            ),
            write(
                "test_roman.py",
                """
                import pytest
                from roman import from_roman, to_roman

                @pytest.mark.parametrize("n,s", [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"),
                                                 (1994, "MCMXCIV"), (2024, "MMXXIV")])
                def test_both_ways(n, s):
                    assert to_roman(n) == s
                    assert from_roman(s) == n

                def test_round_trip():
                    assert all(from_roman(to_roman(n)) == n for n in range(1, 4000))
                """,
            ),
            bash(PEEK),
            bash("python3 -c 'import roman; print(roman.to_roman(3888))'"),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "lru-cache",
        "succeeded",
        [
            write(
                "lru.py",
                """
                class LRU:
                    def __init__(self, capacity):
                        self.capacity = capacity
                        self.data = {}

                    def get(self, key, default=None):
                        return self.data.get(key, default)

                    def put(self, key, value):
                        self.data[key] = value
                        if len(self.data) > self.capacity:
                            self.data.pop(next(iter(self.data)))
                """,
            ),
            write(
                "test_lru.py",
                """
                from lru import LRU

                def test_evicts_oldest():
                    c = LRU(2)
                    c.put("a", 1); c.put("b", 2); c.put("c", 3)
                    assert c.get("a") is None and c.get("c") == 3

                def test_get_refreshes():
                    c = LRU(2)
                    c.put("a", 1); c.put("b", 2)
                    assert c.get("a") == 1
                    c.put("c", 3)
                    assert c.get("a") == 1
                    assert c.get("b") is None
                """,
            ),
            bash(PEEK),
            write(
                "lru.py",
                """
                from collections import OrderedDict

                class LRU:
                    def __init__(self, capacity):
                        self.capacity = capacity
                        self.data = OrderedDict()

                    def get(self, key, default=None):
                        if key not in self.data:
                            return default
                        self.data.move_to_end(key)
                        return self.data[key]

                    def put(self, key, value):
                        self.data[key] = value
                        self.data.move_to_end(key)
                        if len(self.data) > self.capacity:
                            self.data.popitem(last=False)
                """,
            ),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "parse-duration",
        "failed",
        [
            write(
                "duration.py",
                """
                import re

                UNITS = {"h": 3600, "m": 60, "s": 1}

                def parse_duration(text):
                    return sum(int(n) * UNITS[u] for n, u in re.findall(r"(\\d+)([hms])", text))
                """,
            ),
            write(
                "test_duration.py",
                """
                import pytest
                from duration import parse_duration

                def test_simple():
                    assert parse_duration("1h30m") == 5400

                def test_days():
                    assert parse_duration("2d") == 172800

                def test_rejects_garbage():
                    with pytest.raises(ValueError):
                        parse_duration("soon")
                """,
            ),
            bash(PEEK),
            write(
                "duration.py",
                """
                import re

                UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}

                def parse_duration(text):
                    return sum(int(n) * UNITS[u] for n, u in re.findall(r"(\\d+)([dhms])", text))
                """,
            ),
            bash(PYTEST),  # still accepts "soon" as 0: the agent stopped here
        ],
    ),
    trajectory(
        "matrix",
        "succeeded",
        [
            write(
                "matrix.py",
                """
                def transpose(m):
                    return [list(row) for row in zip(*m)]

                def matmul(a, b):
                    bt = transpose(b)
                    return [[sum(x * y for x, y in zip(row, col)) for col in bt] for row in a]
                """,
            ),
            write(
                "test_matrix.py",
                """
                from matrix import matmul, transpose

                def test_transpose():
                    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]

                def test_identity():
                    i = [[1, 0], [0, 1]]
                    m = [[2, 3], [4, 5]]
                    assert matmul(i, m) == m and matmul(m, i) == m

                def test_rectangular():
                    assert matmul([[1, 2, 3]], [[1], [2], [3]]) == [[14]]
                """,
            ),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "binary-search-hang",
        "timed_out",
        [
            write(
                "search.py",
                """
                def bisect_left(items, target):
                    lo, hi = 0, len(items)
                    while lo < hi:
                        mid = (lo + hi) // 2
                        if items[mid] < target:
                            lo = mid      # bug: never moves past mid
                        else:
                            hi = mid
                    return lo
                """,
            ),
            write(
                "test_search.py",
                """
                from search import bisect_left

                def test_found():
                    assert bisect_left([1, 3, 5, 7], 5) == 2

                def test_insert_point():
                    assert bisect_left([1, 3, 5, 7], 6) == 3
                """,
            ),
            bash(PYTEST),
        ],
        limits={"timeout_s": 3},
    ),
    trajectory(
        "word-count-cli",
        "succeeded",
        [
            write(
                "wc.py",
                """
                import sys
                from collections import Counter

                def count(text):
                    return Counter(text.lower().split())

                if __name__ == "__main__":
                    for word, n in count(sys.stdin.read()).most_common(3):
                        print(f"{n} {word}")
                """,
            ),
            write(
                "test_wc.py",
                """
                import subprocess
                import sys

                def test_cli():
                    out = subprocess.run([sys.executable, "wc.py"], input="b a b c b a",
                                         capture_output=True, text=True, check=True).stdout
                    assert out.splitlines() == ["3 b", "2 a", "1 c"]
                """,
            ),
            bash("echo 'the cat and the hat' | python3 wc.py"),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "deep-merge",
        "failed",
        [
            write(
                "merge.py",
                """
                def deep_merge(a, b):
                    out = dict(a)
                    for key, value in b.items():
                        if isinstance(value, dict) and isinstance(out.get(key), dict):
                            out[key] = deep_merge(out[key], value)
                        else:
                            out[key] = value
                    return out
                """,
            ),
            write(
                "test_merge.py",
                """
                from merge import deep_merge

                def test_nested():
                    assert deep_merge({"a": {"x": 1}}, {"a": {"y": 2}}) == {"a": {"x": 1, "y": 2}}

                def test_lists_concatenate():
                    assert deep_merge({"tags": ["a"]}, {"tags": ["b"]}) == {"tags": ["a", "b"]}

                def test_inputs_untouched():
                    a = {"a": {"x": 1}}
                    deep_merge(a, {"a": {"x": 2}})
                    assert a == {"a": {"x": 1}}
                """,
            ),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "merge-intervals",
        "succeeded",
        [
            write(
                "intervals.py",
                """
                def merge(intervals):
                    out = []
                    for start, end in sorted(intervals):
                        if out and start <= out[-1][1]:
                            out[-1][1] = max(out[-1][1], end)
                        else:
                            out.append([start, end])
                    return [tuple(i) for i in out]
                """,
            ),
            write(
                "test_intervals.py",
                """
                from intervals import merge

                def test_overlap():
                    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]

                def test_touching():
                    assert merge([(1, 4), (4, 5)]) == [(1, 5)]

                def test_unsorted_and_empty():
                    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]
                    assert merge([]) == []
                """,
            ),
            bash(PEEK),
            bash(PYTEST + " -k touching"),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "token-bucket",
        "succeeded",
        [
            write(
                "bucket.py",
                """
                class TokenBucket:
                    def __init__(self, rate, capacity, clock):
                        self.rate, self.capacity, self.clock = rate, capacity, clock
                        self.tokens = capacity
                        self.last = clock()

                    def allow(self):
                        now = self.clock()
                        refill = (now - self.last) * self.rate
                        self.tokens = min(self.capacity, self.tokens + refill)
                        self.last = now
                        if self.tokens >= 1:
                            self.tokens -= 1
                            return True
                        return False
                """,
            ),
            write(
                "test_bucket.py",
                """
                from bucket import TokenBucket

                class Clock:
                    t = 0.0
                    def __call__(self):
                        return self.t

                def test_burst_then_refill():
                    clock = Clock()
                    b = TokenBucket(rate=2, capacity=3, clock=clock)
                    assert [b.allow() for _ in range(4)] == [True, True, True, False]
                    clock.t = 0.5
                    assert b.allow() and not b.allow()
                """,
            ),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "csv-report-flood",
        "output_flooded",
        [
            write("sales.csv", "region,amount\nnorth,10\nsouth,7\nnorth,5\n"),
            write(
                "report.py",
                """
                import csv

                rows = list(csv.DictReader(open("sales.csv")))
                totals = {}
                i = 0
                while i < len(rows):          # the agent's debug loop: i is never advanced
                    row = rows[i]
                    print("DEBUG row", i, row)
                    totals[row["region"]] = totals.get(row["region"], 0) + int(row["amount"])
                print(totals)
                """,
            ),
            bash("python3 report.py"),
        ],
        limits={"flood_kill_bytes": 1048576},
    ),
    trajectory(
        "ngram-index-memory",
        "memory_exceeded",
        [
            write(
                "index.py",
                """
                import random

                random.seed(1)
                words = [f"w{random.randrange(50_000)}" for _ in range(200_000)]
                # every n-gram of every length, materialised at once
                n = len(words)
                grams = [tuple(words[i:j]) for i in range(n) for j in range(i + 1, i + 200)]
                print(len(grams))
                """,
            ),
            bash("python3 index.py"),
        ],
        limits={"memory_mb": 128},
    ),
    trajectory(
        "nested-json-crash",
        "crashed",
        [
            write(
                "loader.py",
                """
                import json
                import sys

                # "fix" for RecursionError on deep documents
                sys.setrecursionlimit(10**7)

                def load(text):
                    return json.loads(text)
                """,
            ),
            python(
                """
                from loader import load
                depth = 500_000
                doc = load("[" * depth + "]" * depth)
                print("loaded", type(doc).__name__)
                """
            ),
        ],
    ),
    trajectory(
        "stack-queue",
        "succeeded",
        [
            write(
                "structures.py",
                """
                class Stack:
                    def __init__(self):
                        self._items = []
                    def push(self, x):
                        self._items.append(x)
                    def pop(self):
                        if not self._items:
                            raise IndexError("pop from empty stack")
                        return self._items.pop()
                    def __len__(self):
                        return len(self._items)

                class Queue:
                    def __init__(self):
                        self._in, self._out = Stack(), Stack()
                    def put(self, x):
                        self._in.push(x)
                    def get(self):
                        if not len(self._out):
                            while len(self._in):
                                self._out.push(self._in.pop())
                        return self._out.pop()
                """,
            ),
            write(
                "test_structures.py",
                """
                import pytest
                from structures import Queue, Stack

                def test_stack_lifo():
                    s = Stack()
                    for i in range(3):
                        s.push(i)
                    assert [s.pop() for _ in range(3)] == [2, 1, 0]
                    with pytest.raises(IndexError):
                        s.pop()

                def test_queue_fifo_interleaved():
                    q = Queue()
                    q.put(1); q.put(2)
                    assert q.get() == 1
                    q.put(3)
                    assert [q.get(), q.get()] == [2, 3]
                """,
            ),
            bash(PYTEST),
            read("structures.py"),
        ],
    ),
    trajectory(
        "leap-years",
        "failed",
        [
            write(
                "dates.py",
                """
                def is_leap(year):
                    return year % 4 == 0

                def days_in_february(year):
                    return 29 if is_leap(year) else 28
                """,
            ),
            write(
                "test_dates.py",
                """
                import pytest
                from dates import days_in_february, is_leap

                @pytest.mark.parametrize("year,leap", [(2024, True), (2023, False),
                                                       (1900, False), (2000, True)])
                def test_is_leap(year, leap):
                    assert is_leap(year) is leap

                def test_february():
                    assert days_in_february(2100) == 28
                """,
            ),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "calculator-tokenizer",
        "succeeded",
        [
            write(
                "calc.py",
                """
                import re

                def tokenize(expr):
                    return re.findall(r"\\d+|[-+*/()]", expr)

                def evaluate(expr):
                    return eval(" ".join(tokenize(expr)))
                """,
            ),
            write(
                "test_calc.py",
                """
                from calc import evaluate, tokenize

                def test_tokens():
                    assert tokenize("12+3*(4-1)") == ["12", "+", "3", "*", "(", "4", "-", "1", ")"]

                def test_precedence():
                    assert evaluate("2+3*4") == 14

                def test_decimals():
                    assert evaluate("1.5*2") == 3.0
                """,
            ),
            bash(PEEK),
            write(
                "calc.py",
                """
                import re

                def tokenize(expr):
                    return re.findall(r"\\d+(?:\\.\\d+)?|[-+*/()]", expr)

                def evaluate(expr):
                    return eval(" ".join(tokenize(expr)), {"__builtins__": {}})
                """,
            ),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "config-env-overrides",
        "succeeded",
        [
            write("app.ini", "[server]\nhost = 127.0.0.1\nport = 8000\n"),
            write(
                "config.py",
                """
                import configparser
                import os

                def load(path, environ=os.environ):
                    parser = configparser.ConfigParser()
                    parser.read(path)
                    cfg = {f"{s}.{k}": v for s in parser.sections() for k, v in parser[s].items()}
                    for key in list(cfg):
                        env = "APP_" + key.upper().replace(".", "_")
                        if env in environ:
                            cfg[key] = environ[env]
                    return cfg
                """,
            ),
            write(
                "test_config.py",
                """
                from config import load

                def test_file_values():
                    assert load("app.ini", {})["server.port"] == "8000"

                def test_env_wins():
                    assert load("app.ini", {"APP_SERVER_PORT": "9000"})["server.port"] == "9000"
                """,
            ),
            bash(
                "APP_SERVER_HOST=0.0.0.0 "
                "python3 -c 'import config; print(config.load(\"app.ini\"))'"
            ),
            bash(PYTEST),
        ],
        env={"APP_SERVER_PORT": "8000"},
    ),
    trajectory(
        "wait-for-service-hang",
        "timed_out",
        [
            write(
                "ready.py",
                """
                import socket
                import time

                def wait_for_port(port, host="127.0.0.1"):
                    while True:                      # no deadline: waits forever
                        try:
                            socket.create_connection((host, port), timeout=0.2).close()
                            return
                        except OSError:
                            time.sleep(0.1)
                """,
            ),
            write(
                "test_ready.py",
                """
                from ready import wait_for_port

                def test_service_comes_up():
                    wait_for_port(5999)
                """,
            ),
            bash(PYTEST),
        ],
        limits={"timeout_s": 2},
    ),
    trajectory(
        "text-wrap",
        "failed",
        [
            write(
                "wrap.py",
                """
                def wrap(text, width):
                    lines, line = [], ""
                    for word in text.split():
                        if len(line) + len(word) + 1 > width:
                            lines.append(line)
                            line = word
                        else:
                            line = f"{line} {word}"
                    return lines + [line]
                """,
            ),
            write(
                "test_wrap.py",
                """
                from wrap import wrap

                def test_wraps():
                    assert wrap("the quick brown fox", 10) == ["the quick", "brown fox"]

                def test_long_word_alone():
                    assert wrap("a supercalifragilistic b", 5) == ["a", "supercalifragilistic", "b"]

                def test_empty():
                    assert wrap("", 10) == []
                """,
            ),
            bash(PEEK),
            write(
                "wrap.py",
                """
                def wrap(text, width):
                    lines, line = [], ""
                    for word in text.split():
                        if line and len(line) + len(word) + 1 > width:
                            lines.append(line)
                            line = word
                        else:
                            line = f"{line} {word}".strip()
                    return lines + [line]
                """,
            ),
            bash(PYTEST),  # the empty-text case still fails
        ],
    ),
    trajectory(
        "dijkstra",
        "succeeded",
        [
            write(
                "graph.py",
                """
                import heapq

                def shortest(graph, start):
                    dist = {start: 0}
                    heap = [(0, start)]
                    while heap:
                        d, node = heapq.heappop(heap)
                        if d > dist.get(node, float("inf")):
                            continue
                        for nxt, w in graph.get(node, {}).items():
                            if d + w < dist.get(nxt, float("inf")):
                                dist[nxt] = d + w
                                heapq.heappush(heap, (d + w, nxt))
                    return dist
                """,
            ),
            write(
                "test_graph.py",
                """
                from graph import shortest

                G = {"a": {"b": 1, "c": 4}, "b": {"c": 2, "d": 5}, "c": {"d": 1}}

                def test_distances():
                    assert shortest(G, "a") == {"a": 0, "b": 1, "c": 3, "d": 4}

                def test_unreachable_absent():
                    assert "a" not in shortest(G, "c")
                """,
            ),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "bank-account",
        "succeeded",
        [
            write(
                "bank.py",
                """
                class InsufficientFunds(ValueError):
                    pass

                class Account:
                    def __init__(self, balance=0):
                        self.balance = balance

                    def withdraw(self, amount):
                        if amount > self.balance:
                            raise InsufficientFunds(f"balance {self.balance} < {amount}")
                        self.balance -= amount

                    def transfer(self, other, amount):
                        self.withdraw(amount)
                        other.balance += amount
                """,
            ),
            write(
                "test_bank.py",
                """
                import pytest
                from bank import Account, InsufficientFunds

                def test_transfer():
                    a, b = Account(10), Account()
                    a.transfer(b, 4)
                    assert (a.balance, b.balance) == (6, 4)

                def test_overdraft_leaves_both_untouched():
                    a, b = Account(1), Account()
                    with pytest.raises(InsufficientFunds):
                        a.transfer(b, 5)
                    assert (a.balance, b.balance) == (1, 0)
                """,
            ),
            bash(PYTEST),
            bash(PYTEST + " --co -q | head -n 5"),
        ],
    ),
    trajectory(
        "markdown-table",
        "succeeded",
        [
            write(
                "mdtable.py",
                """
                def render(rows):
                    header, *body = rows
                    lines = ["| " + " | ".join(header) + " |", "|---|"]
                    lines += ["| " + " | ".join(map(str, r)) + " |" for r in body]
                    return "\\n".join(lines)
                """,
            ),
            write(
                "test_mdtable.py",
                """
                from mdtable import render

                def test_render():
                    out = render([["name", "n"], ["a", 1], ["bb", 22]])
                    assert out.splitlines() == [
                        "| name | n  |",
                        "| ---- | -- |",
                        "| a    | 1  |",
                        "| bb   | 22 |",
                    ]
                """,
            ),
            bash(PEEK),
            write(
                "mdtable.py",
                """
                def render(rows):
                    cells = [[str(c) for c in r] for r in rows]
                    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
                    def line(r):
                        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
                    rule = "| " + " | ".join("-" * w for w in widths) + " |"
                    return "\\n".join([line(cells[0]), rule, *map(line, cells[1:])])
                """,
            ),
            bash(PYTEST),
            python("from mdtable import render\nprint(render([['k', 'v'], ['x', 1]]))"),
        ],
    ),
    trajectory(
        "url-normalise",
        "failed",
        [
            write(
                "urls.py",
                """
                from urllib.parse import urlsplit, urlunsplit

                def normalise(url):
                    parts = urlsplit(url)
                    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(),
                                       parts.path or "/", parts.query, ""))
                """,
            ),
            write(
                "test_urls.py",
                """
                import pytest
                from urls import normalise

                @pytest.mark.parametrize("raw,want", [
                    ("HTTP://Example.COM", "http://example.com/"),
                    ("http://example.com/a#frag", "http://example.com/a"),
                    ("http://example.com:80/", "http://example.com/"),
                    ("https://example.com:443/x", "https://example.com/x"),
                    ("http://example.com/?b=2&a=1", "http://example.com/?a=1&b=2"),
                ])
                def test_normalise(raw, want):
                    assert normalise(raw) == want
                """,
            ),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "trie-autocomplete",
        "succeeded",
        [
            write(
                "trie.py",
                """
                class Trie:
                    def __init__(self):
                        self.root = {}

                    def add(self, word):
                        node = self.root
                        for ch in word:
                            node = node.setdefault(ch, {})
                        node["$"] = True

                    def complete(self, prefix):
                        node = self.root
                        for ch in prefix:
                            if ch not in node:
                                return []
                            node = node[ch]
                        out, stack = [], [(node, prefix)]
                        while stack:
                            node, word = stack.pop()
                            if "$" in node:
                                out.append(word)
                            stack += [(n, word + c) for c, n in node.items() if c != "$"]
                        return sorted(out)
                """,
            ),
            write(
                "test_trie.py",
                """
                from trie import Trie

                def test_complete():
                    t = Trie()
                    for w in ["car", "cart", "care", "dog"]:
                        t.add(w)
                    assert t.complete("car") == ["car", "care", "cart"]
                    assert t.complete("x") == []
                """,
            ),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "camel-to-snake",
        "succeeded",
        [
            write(
                "case.py",
                """
                import re

                def snake(name):
                    return re.sub(r"([A-Z])", r"_\\1", name).lower()
                """,
            ),
            write(
                "test_case.py",
                """
                import pytest
                from case import snake

                @pytest.mark.parametrize("camel,want", [("fooBar", "foo_bar"),
                                                        ("HTTPServer", "http_server"),
                                                        ("getHTTPResponse", "get_http_response")])
                def test_snake(camel, want):
                    assert snake(camel) == want
                """,
            ),
            bash(PEEK),
            write(
                "case.py",
                """
                import re

                def snake(name):
                    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\\1_\\2", name)
                    return re.sub(r"([a-z0-9])([A-Z])", r"\\1_\\2", name).lower()
                """,
            ),
            bash(PYTEST),
        ],
    ),
    trajectory(
        "semver-report",
        "succeeded",
        [
            write(
                "semver.py",
                """
                def key(version):
                    core, _, pre = version.partition("-")
                    nums = tuple(int(p) for p in core.split("."))
                    return nums + ((1,) if not pre else (0, pre))

                def latest(versions):
                    return max(versions, key=key)
                """,
            ),
            write(
                "test_semver.py",
                """
                from semver import latest

                def test_numeric_not_lexical():
                    assert latest(["1.9.0", "1.10.0"]) == "1.10.0"

                def test_release_beats_prerelease():
                    assert latest(["2.0.0-rc1", "2.0.0"]) == "2.0.0"
                """,
            ),
            bash(PYTEST + " --junitxml=report.xml"),
        ],
        collect=["report.xml"],
    ),
]


# ------------------------------------------------------------------ HumanEval-style


def problem(task: str, expect: str, solution: str, tests: str, entry: str, **limits) -> dict:
    code = src(solution) + "\n\n" + src(tests) + f"\n\ncheck({entry})\n"
    job = {"code": code, "labels": {"suite": "humaneval", "task": task, "expect": expect}}
    job["limits"] = {"timeout_s": 10, **limits}
    return job


HUMANEVAL = [
    problem(
        "he/000-has-close-elements",
        "succeeded",
        """
        def has_close_elements(numbers: list[float], threshold: float) -> bool:
            ordered = sorted(numbers)
            return any(b - a < threshold for a, b in zip(ordered, ordered[1:]))
        """,
        """
        def check(candidate):
            assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) is True
            assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) is False
            assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) is True
            assert candidate([], 1.0) is False
        """,
        "has_close_elements",
    ),
    problem(
        "he/001-separate-paren-groups",
        "succeeded",
        """
        def separate_paren_groups(s: str) -> list[str]:
            groups, depth, current = [], 0, []
            for ch in s.replace(" ", ""):
                current.append(ch)
                depth += 1 if ch == "(" else -1
                if depth == 0:
                    groups.append("".join(current))
                    current = []
            return groups
        """,
        """
        def check(candidate):
            assert candidate("( ) (( )) (( )( ))") == ["()", "(())", "(()())"]
            assert candidate("(()(())((())))") == ["(()(())((())))"]
        """,
        "separate_paren_groups",
    ),
    problem(
        "he/002-truncate-number",
        "succeeded",
        """
        def truncate_number(number: float) -> float:
            return number % 1.0
        """,
        """
        def check(candidate):
            assert candidate(3.5) == 0.5
            assert abs(candidate(1.33) - 0.33) < 1e-6
            assert abs(candidate(123.456) - 0.456) < 1e-6
        """,
        "truncate_number",
    ),
    problem(
        "he/003-below-zero",
        "failed",
        """
        def below_zero(operations: list[int]) -> bool:
            return sum(operations) < 0   # wrong: checks only the final balance
        """,
        """
        def check(candidate):
            assert candidate([1, 2, -4, 5]) is True
            assert candidate([1, 2, -3]) is False
        """,
        "below_zero",
    ),
    problem(
        "he/004-mean-absolute-deviation",
        "succeeded",
        """
        def mean_absolute_deviation(numbers: list[float]) -> float:
            mean = sum(numbers) / len(numbers)
            return sum(abs(x - mean) for x in numbers) / len(numbers)
        """,
        """
        def check(candidate):
            assert abs(candidate([1.0, 2.0, 3.0]) - 2.0 / 3.0) < 1e-6
            assert abs(candidate([1.0, 2.0, 3.0, 4.0]) - 1.0) < 1e-6
        """,
        "mean_absolute_deviation",
    ),
    problem(
        "he/005-intersperse",
        "succeeded",
        """
        def intersperse(numbers: list[int], delimiter: int) -> list[int]:
            out = []
            for i, n in enumerate(numbers):
                if i:
                    out.append(delimiter)
                out.append(n)
            return out
        """,
        """
        def check(candidate):
            assert candidate([], 7) == []
            assert candidate([5, 6, 3, 2], 8) == [5, 8, 6, 8, 3, 8, 2]
        """,
        "intersperse",
    ),
    problem(
        "he/006-parse-nested-parens",
        "failed",
        """
        def parse_nested_parens(s: str) -> list[int]:
            return [g.count("(") for g in s.split()]   # counts parens, not depth
        """,
        """
        def check(candidate):
            assert candidate("(()()) ((())) () ((())()())") == [2, 3, 1, 3]
        """,
        "parse_nested_parens",
    ),
    problem(
        "he/007-filter-by-substring",
        "succeeded",
        """
        def filter_by_substring(strings: list[str], substring: str) -> list[str]:
            return [s for s in strings if substring in s]
        """,
        """
        def check(candidate):
            assert candidate([], "a") == []
            assert candidate(["abc", "bacd", "cde", "array"], "a") == ["abc", "bacd", "array"]
        """,
        "filter_by_substring",
    ),
    problem(
        "he/008-sum-product",
        "succeeded",
        """
        import math

        def sum_product(numbers: list[int]) -> tuple[int, int]:
            return sum(numbers), math.prod(numbers)
        """,
        """
        def check(candidate):
            assert candidate([]) == (0, 1)
            assert candidate([1, 2, 3, 4]) == (10, 24)
        """,
        "sum_product",
    ),
    problem(
        "he/009-rolling-max",
        "succeeded",
        """
        from itertools import accumulate

        def rolling_max(numbers: list[int]) -> list[int]:
            return list(accumulate(numbers, max))
        """,
        """
        def check(candidate):
            assert candidate([1, 2, 3, 2, 3, 4, 2]) == [1, 2, 3, 3, 3, 4, 4]
            assert candidate([]) == []
        """,
        "rolling_max",
    ),
    problem(
        "he/010-make-palindrome",
        "timed_out",
        """
        def make_palindrome(s: str) -> str:
            i = 0
            while s[i:] != s[i:][::-1]:
                i + 1            # typo: never advances
            return s + s[:i][::-1]
        """,
        """
        def check(candidate):
            assert candidate("") == ""
            assert candidate("cat") == "catac"
        """,
        "make_palindrome",
        timeout_s=2,
    ),
    problem(
        "he/011-string-xor",
        "succeeded",
        """
        def string_xor(a: str, b: str) -> str:
            return "".join("0" if x == y else "1" for x, y in zip(a, b))
        """,
        """
        def check(candidate):
            assert candidate("010", "110") == "100"
            assert candidate("111000", "101010") == "010010"
        """,
        "string_xor",
    ),
    problem(
        "he/012-longest",
        "failed",
        """
        def longest(strings: list[str]) -> str | None:
            return max(strings, key=len)     # crashes on [] instead of returning None
        """,
        """
        def check(candidate):
            assert candidate([]) is None
            assert candidate(["x", "yyy", "zzz"]) == "yyy"
        """,
        "longest",
    ),
    problem(
        "he/013-greatest-common-divisor",
        "succeeded",
        """
        def greatest_common_divisor(a: int, b: int) -> int:
            while b:
                a, b = b, a % b
            return a
        """,
        """
        def check(candidate):
            assert candidate(3, 7) == 1
            assert candidate(25, 15) == 5
            assert candidate(144, 60) == 12
        """,
        "greatest_common_divisor",
    ),
    problem(
        "he/014-all-prefixes",
        "succeeded",
        """
        def all_prefixes(s: str) -> list[str]:
            return [s[: i + 1] for i in range(len(s))]
        """,
        """
        def check(candidate):
            assert candidate("") == []
            assert candidate("abc") == ["a", "ab", "abc"]
        """,
        "all_prefixes",
    ),
    problem(
        "he/015-count-distinct-characters",
        "succeeded",
        """
        def count_distinct_characters(s: str) -> int:
            return len(set(s.lower()))
        """,
        """
        def check(candidate):
            assert candidate("xyzXYZ") == 3
            assert candidate("Jerry jERRY JeRRRY") == 5
        """,
        "count_distinct_characters",
    ),
    problem(
        "he/016-parse-music",
        "failed",
        """
        def parse_music(notes: str) -> list[int]:
            beats = {"o": 4, "o|": 2, ".|": 1}
            return [beats[n] for n in notes.split(" ")]   # KeyError on ""
        """,
        """
        def check(candidate):
            assert candidate("") == []
            assert candidate("o o| .| o| o| .| .| .| .| o o") == [4, 2, 1, 2, 2, 1, 1, 1, 1, 4, 4]
        """,
        "parse_music",
    ),
    problem(
        "he/017-how-many-times",
        "succeeded",
        """
        def how_many_times(s: str, sub: str) -> int:
            return sum(s.startswith(sub, i) for i in range(len(s)))
        """,
        """
        def check(candidate):
            assert candidate("", "x") == 0
            assert candidate("aaaa", "aa") == 3
            assert candidate("cacacacac", "cac") == 4
        """,
        "how_many_times",
    ),
    problem(
        "he/018-sort-numbers",
        "failed",
        """
        WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

        def sort_numbers(numbers: str) -> str:
            return " ".join(sorted(numbers.split()))    # sorts alphabetically
        """,
        """
        def check(candidate):
            assert candidate("three one five") == "one three five"
        """,
        "sort_numbers",
    ),
    problem(
        "he/019-find-closest-elements",
        "succeeded",
        """
        def find_closest_elements(numbers: list[float]) -> tuple[float, float]:
            ordered = sorted(numbers)
            return min(zip(ordered, ordered[1:]), key=lambda p: p[1] - p[0])
        """,
        """
        def check(candidate):
            assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2]) == (3.9, 4.0)
            assert candidate([1.0, 2.0, 5.9, 4.0, 5.0]) == (5.0, 5.9)
        """,
        "find_closest_elements",
    ),
    problem(
        "he/020-syntax-error",
        "failed",
        """
        def strlen(s: str) -> int
            return len(s)
        """,
        """
        def check(candidate):
            assert candidate("abc") == 3
        """,
        "strlen",
    ),
]


# ------------------------------------------------------------------ invalid lines

# What a real batch file looks like after a buggy generator: each line is reported with
# its number and reason, and the valid lines around it still run.
INVALID = [
    json.dumps({"command": "echo before the bad lines", "labels": {"expect": "succeeded"}}),
    '{"command": "echo unterminated',
    json.dumps({"command": "echo hi", "timeout": 5}),
    json.dumps({"command": "sleep 7200", "limits": {"timeout_s": 7200}}),
    json.dumps({"steps": [{"kind": "write_file", "path": "../../etc/passwd", "content": "x"}]}),
    json.dumps(["echo", "not an object"]),
    json.dumps({"labels": {"note": "no steps at all"}}),
    json.dumps({"command": "echo after the bad lines", "labels": {"expect": "succeeded"}}),
]


def render(jobs: list[dict]) -> str:
    return "".join(json.dumps(job, separators=(",", ":")) + "\n" for job in jobs)


FILES = {
    "trajectories.jsonl": lambda: render(TRAJECTORIES),
    "humaneval.jsonl": lambda: render(HUMANEVAL),
    "invalid.jsonl": lambda: "".join(line + "\n" for line in INVALID),
}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, build in FILES.items():
        path = HERE / name
        text = build()
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python3 examples/build.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
