"""Renders a Helm chart as ``helm template`` does, for the chart's tests, without helm.

Why not helm: no helm is installable here through the project's package managers (Debian 12 has
no helm package and its Go 1.19 cannot build helm 3; the PyPI bindings, helm-sdkpy, need
Python >= 3.12 and have no ``template`` action). So this module implements Go's text/template
language (actions with ``{{-``/``-}}`` trimming, comments, pipelines, parenthesised calls,
variables, ``if``/``else if``/``else``, ``range`` over lists and maps (keys sorted, as Go does),
``with``, ``define``/``include``) and the Sprig/Helm functions a chart of this project may use
(:data:`FUNCTIONS`), with helm's semantics where they matter for YAML: ``toYaml`` drops the trailing
newline, ``nindent`` starts a new line, ``quote`` quotes with Go's ``%q``, missing map keys are
empty, maps iterate in key order. Anything else (an unknown function, an unclosed action, a
``template`` action) raises :class:`TemplateError`, so the chart cannot silently use a construct
this renderer would get wrong. ``tests/test_helm_chart.py`` renders the chart with it, validates
every manifest with kubernetes-validate, and, where a ``helm`` binary exists, compares the output
with ``helm template``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["FUNCTIONS", "TemplateError", "render_chart"]


class TemplateError(Exception):
    pass


# -- lexing ----------------------------------------------------------------------------------

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)


def _lex(text: str, name: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", body) pieces, trim markers applied to the neighbouring text."""
    out: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(text):
        chunk = text[pos : m.start()]
        if trim_next:
            chunk = chunk.lstrip(" \t\r\n")
        if m.group(1):
            chunk = chunk.rstrip(" \t\r\n")
        out.append(("text", chunk))
        body = m.group(2).strip()
        if "{{" in body:
            raise TemplateError(f"{name}: unclosed action near {body[:40]!r}")
        if not (body.startswith("/*") and body.endswith("*/")):
            out.append(("action", body))
        trim_next = bool(m.group(3))
        pos = m.end()
    rest = text[pos:]
    if "{{" in rest:
        raise TemplateError(f"{name}: unclosed action")
    out.append(("text", rest.lstrip(" \t\r\n") if trim_next else rest))
    return out


_TOKEN = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<num>-?\d+(?:\.\d+)?)
    | (?P<decl>:=)
    | (?P<assign>=)
    | (?P<punct>[|(),])
    | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
    | (?P<field>(?:\.[A-Za-z0-9_]+)+|\.)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
    )""",
    re.X,
)


def _tokens(body: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    body = body.strip()
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if m is None or m.end() == pos:
            raise TemplateError(f"cannot parse {body[pos:]!r}")
        kind = m.lastgroup
        if kind == "field" and pos > 0 and body[pos] == "." and body[pos - 1] == ")":
            kind = "chained"  # (pipeline).field, written without a space
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(body) and body[pos].isspace():
            pos += 1
    return out


# -- parsing ---------------------------------------------------------------------------------


@dataclass
class Pipeline:
    decl: list[str]  # variables declared (:=) or assigned (=)
    assign: bool
    commands: list[list[Any]]  # each command: operands (token tuples or nested Pipelines)


@dataclass
class Node:
    kind: str  # text, action, if, range, with
    text: str = ""
    pipe: Pipeline | None = None
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)


def _parse_pipeline(tokens: list[tuple[str, str]]) -> Pipeline:
    decl: list[str] = []
    assign = False
    for i, (kind, _) in enumerate(tokens):
        if kind in ("decl", "assign"):
            names = [v for k, v in tokens[:i] if k == "var"]
            if not names or any(k not in ("var", "punct") for k, _ in tokens[:i]):
                break
            decl, assign, tokens = names, kind == "assign", tokens[i + 1 :]
            break
    commands: list[list[Any]] = [[]]
    stack: list[list[list[Any]]] = []
    for tok in tokens:
        if tok == ("punct", "("):
            stack.append(commands)
            commands = [[]]
        elif tok == ("punct", ")"):
            if not stack:
                raise TemplateError("unbalanced )")
            inner = Pipeline([], False, commands)
            commands = stack.pop()
            commands[-1].append(inner)
        elif tok == ("punct", "|"):
            commands.append([])
        elif tok[0] == "chained":
            if not commands[-1] or not isinstance(commands[-1][-1], Pipeline):
                raise TemplateError(f"unexpected {tok[1]}")
            commands[-1][-1] = ("chain", (commands[-1][-1], tok[1]))  # (pipeline).field
        else:
            commands[-1].append(tok)
    if stack:
        raise TemplateError("unbalanced (")
    if any(not c for c in commands):
        raise TemplateError("empty command in pipeline")
    return Pipeline(decl, assign, commands)


def _parse(pieces: list[tuple[str, str]], name: str, defines: dict[str, list[Node]]) -> list[Node]:
    pos = 0

    def block(stop: tuple[str, ...]) -> tuple[list[Node], str]:
        nonlocal pos
        nodes: list[Node] = []
        while pos < len(pieces):
            kind, body = pieces[pos]
            pos += 1
            if kind == "text":
                if body:
                    nodes.append(Node("text", text=body))
                continue
            word = body.split(None, 1)[0] if body else ""
            rest = body[len(word) :].strip()
            if word in stop:
                return nodes, body
            if word in ("if", "range", "with"):
                node = Node(word, pipe=_parse_pipeline(_tokens(rest)))
                node.body, ended = block(("else", "end"))
                chain = node
                while ended.startswith("else"):
                    tail = ended[4:].strip()
                    if tail.startswith(("if ", "with ")):  # else if / else with: a nested block, one end
                        w = tail.split(None, 1)[0]
                        inner = Node(w, pipe=_parse_pipeline(_tokens(tail[len(w) :].strip())))
                        inner.body, ended = block(("else", "end"))
                        chain.orelse = [inner]
                        chain = inner
                    else:
                        chain.orelse, ended = block(("end",))
                nodes.append(node)
            elif word == "define":
                tname = json.loads(rest)
                defines[tname], _ = block(("end",))
            elif word in ("template", "block", "break", "continue"):
                raise TemplateError(f"{name}: {word} is not supported here (use include)")
            elif word in ("end", "else"):
                raise TemplateError(f"{name}: unexpected {word}")
            else:
                nodes.append(Node("action", pipe=_parse_pipeline(_tokens(body))))
        if stop:
            raise TemplateError(f"{name}: missing {{{{ end }}}}")
        return nodes, ""

    nodes, _ = block(())
    return nodes


# -- functions (Go builtins, Sprig, Helm) ----------------------------------------------------


def _to_yaml(v: Any) -> str:
    if v is None:
        return "null"
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True, width=1 << 20).rstrip("\n")


def _indent(n: int, s: Any) -> str:
    pad = " " * int(n)
    return pad + _str(s).replace("\n", "\n" + pad)


def _empty(v: Any) -> bool:
    """Sprig's empty (and Go's false for if/with): nil, false, 0, "" and empty lists and maps."""
    if v is None or v is False:
        return True
    if isinstance(v, bool):
        return False
    if isinstance(v, int | float):
        return v == 0
    if isinstance(v, str | list | tuple | dict):
        return len(v) == 0
    return False


def _default(d: Any, *given: Any) -> Any:
    return d if not given or _empty(given[0]) else given[0]


def _required(msg: str, v: Any) -> Any:
    if v is None or v == "":
        raise TemplateError(msg)
    return v


def _printf(fmt: str, *args: Any) -> str:
    it = iter(args)

    def one(m: re.Match) -> str:
        if m[0] == "%%":
            return "%"
        v = next(it)
        return _str(v) if m[1] in "sv" else str(int(v)) if m[1] == "d" else json.dumps(_str(v))

    return re.sub(r"%%|%([svdq])", one, fmt)


def _go_quote(s: Any) -> str:
    return json.dumps(_str(s), ensure_ascii=False)


def _trunc(n: int, s: str) -> str:
    return s[: int(n)] if n >= 0 else s[int(n) :]


def _cmp(op: Callable[[Any, Any], bool]) -> Callable[..., bool]:
    return lambda a, b: op(a, b)


def _and(*a: Any) -> Any:
    for v in a:
        if _empty(v):
            return v
    return a[-1]


def _or(*a: Any) -> Any:
    for v in a:
        if not _empty(v):
            return v
    return a[-1]


def _dict(*kv: Any) -> dict:
    return {str(kv[i]): kv[i + 1] for i in range(0, len(kv), 2)}


FUNCTIONS: dict[str, Callable[..., Any]] = {
    # Go text/template builtins
    "and": _and,
    "or": _or,
    "not": lambda v: _empty(v),
    "eq": lambda a, *b: any(a == x for x in b),
    "ne": _cmp(lambda a, b: a != b),
    "lt": _cmp(lambda a, b: a < b),
    "le": _cmp(lambda a, b: a <= b),
    "gt": _cmp(lambda a, b: a > b),
    "ge": _cmp(lambda a, b: a >= b),
    "len": lambda v: len(v),
    "index": lambda v, *keys: _index(v, keys),
    "printf": _printf,
    "print": lambda *a: "".join(_str(x) for x in a),
    # Sprig
    "default": _default,
    "empty": _empty,
    "quote": lambda *a: " ".join(_go_quote(x) for x in a),
    "squote": lambda *a: " ".join(f"'{_str(x)}'" for x in a),
    "indent": _indent,
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "trunc": _trunc,
    "trimSuffix": lambda suf, s: s.removesuffix(suf),
    "trimPrefix": lambda pre, s: s.removeprefix(pre),
    "trim": lambda s: _str(s).strip(),
    "lower": lambda s: _str(s).lower(),
    "upper": lambda s: _str(s).upper(),
    "replace": lambda old, new, s: _str(s).replace(old, new),
    "contains": lambda sub, s: sub in _str(s),
    "hasPrefix": lambda pre, s: _str(s).startswith(pre),
    "join": lambda sep, v: sep.join(_str(x) for x in v),
    "b64enc": lambda s: base64.b64encode(_str(s).encode()).decode(),
    "sha256sum": lambda s: hashlib.sha256(_str(s).encode()).hexdigest(),
    "int": lambda v: int(v or 0),
    "toString": lambda v: _str(v),
    "list": lambda *a: list(a),
    "dict": _dict,
    "hasKey": lambda d, k: k in d,
    "keys": lambda d: list(d),
    "toJson": lambda v: json.dumps(v, separators=(",", ":"), sort_keys=True),
    "toYaml": _to_yaml,
    "fromYaml": lambda s: yaml.safe_load(s) or {},
    "required": _required,
    "fail": lambda msg: (_ for _ in ()).throw(TemplateError(msg)),
}


def _index(v: Any, keys: tuple) -> Any:
    for k in keys:
        v = v.get(k) if isinstance(v, Mapping) else v[int(k)]
    return v


def _str(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, dict | list):
        return _go_format(v)
    return str(v)


def _go_format(v: Any) -> str:
    """Go's %v of a map or slice (map[a:1 b:2], [1 2]): only ever printed by mistake."""
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_go_format(v[k])}" for k in sorted(v)) + "]"
    if isinstance(v, list):
        return "[" + " ".join(_go_format(x) for x in v) + "]"
    return _str(v)


# -- evaluation ------------------------------------------------------------------------------


class _Files:
    def __init__(self, root: Path) -> None:
        self.root = root

    def Get(self, path: str) -> str:  # helm's name
        p = self.root / path
        return p.read_text(encoding="utf-8") if p.is_file() else ""


class _Renderer:
    def __init__(self, defines: dict[str, list[Node]], root: Any) -> None:
        self.defines = defines
        self.root = root

    def run(self, nodes: list[Node], dot: Any, scopes: list[dict[str, Any]]) -> str:
        out: list[str] = []
        for n in nodes:
            if n.kind == "text":
                out.append(n.text)
            elif n.kind == "action":
                v = self.pipe(n.pipe, dot, scopes)
                if not n.pipe.decl:
                    out.append(_str(v))
            elif n.kind in ("if", "with"):
                inner = [*scopes, {}]
                v = self.pipe(n.pipe, dot, inner)
                if not _empty(v):
                    out.append(self.run(n.body, v if n.kind == "with" else dot, inner))
                else:
                    out.append(self.run(n.orelse, dot, [*scopes, {}]))
            elif n.kind == "range":
                pipe = Pipeline([], False, n.pipe.commands)
                seq = self.pipe(pipe, dot, scopes)
                items = [(k, seq[k]) for k in sorted(seq)] if isinstance(seq, Mapping) else list(enumerate(seq or ()))
                if not items:
                    out.append(self.run(n.orelse, dot, [*scopes, {}]))
                for k, v in items:
                    frame: dict[str, Any] = {}
                    if len(n.pipe.decl) == 1:
                        frame[n.pipe.decl[0]] = v
                    elif len(n.pipe.decl) == 2:
                        frame[n.pipe.decl[0]], frame[n.pipe.decl[1]] = k, v
                    out.append(self.run(n.body, v, [*scopes, frame]))
        return "".join(out)

    def pipe(self, p: Pipeline, dot: Any, scopes: list[dict[str, Any]]) -> Any:
        value: Any = _MISSING
        for cmd in p.commands:
            value = self.command(cmd, dot, scopes, value)
        if p.decl:
            name = p.decl[-1]
            if p.assign:
                for frame in reversed(scopes):
                    if name in frame:
                        frame[name] = value
                        break
                else:
                    raise TemplateError(f"undefined variable {name}")
            else:
                scopes[-1][name] = value
        return value

    def command(self, cmd: list[Any], dot: Any, scopes: list[dict[str, Any]], piped: Any) -> Any:
        head = cmd[0]
        if isinstance(head, tuple) and head[0] == "ident" and head[1] not in ("true", "false", "nil"):
            fname = head[1]
            args = [self.operand(a, dot, scopes) for a in cmd[1:]]
            if piped is not _MISSING:
                args.append(piped)
            if fname == "include":
                return self.include(*args)
            if fname == "tpl":
                raise TemplateError("tpl is not supported here")
            fn = FUNCTIONS.get(fname)
            if fn is None:
                raise TemplateError(f"function {fname!r} is not implemented by tests/helm_render.py")
            return fn(*args)
        value = self.operand(head, dot, scopes)
        if callable(value):  # a method such as .Files.Get
            args = [self.operand(a, dot, scopes) for a in cmd[1:]]
            if piped is not _MISSING:
                args.append(piped)
            return value(*args)
        if len(cmd) > 1 or piped is not _MISSING:
            raise TemplateError(f"{head} is not a function")
        return value

    def include(self, name: str, dot: Any) -> str:
        if name not in self.defines:
            raise TemplateError(f"no template {name!r}")
        return self.run(self.defines[name], dot, [{"$": dot}])

    def operand(self, tok: Any, dot: Any, scopes: list[dict[str, Any]]) -> Any:
        if isinstance(tok, Pipeline):
            return self.pipe(tok, dot, [*scopes, {}])
        kind, text = tok
        if kind == "chain":
            inner, path = text
            return _walk(self.pipe(inner, dot, [*scopes, {}]), path)
        if kind == "str":
            return json.loads(text)
        if kind == "raw":
            return text[1:-1]
        if kind == "num":
            return float(text) if "." in text else int(text)
        if kind == "field":
            return dot if text == "." else _walk(dot, text)
        if kind == "var":
            name, _, path = text.partition(".")
            for frame in reversed(scopes):
                if name in frame:
                    base = frame[name]
                    break
            else:
                if name != "$":
                    raise TemplateError(f"undefined variable {name}")
                base = self.root
            return _walk(base, "." + path) if path else base
        if kind == "ident":
            return {"true": True, "false": False, "nil": None}.get(text, _MISSING)
        raise TemplateError(f"unexpected {text!r}")


_MISSING = object()


def _walk(v: Any, path: str) -> Any:
    for part in path.strip(".").split("."):
        if not part:
            continue
        if isinstance(v, Mapping):
            v = v.get(part)
        elif v is None:
            raise TemplateError(f"nil pointer evaluating .{part}")
        else:
            v = getattr(v, part, None)
    return v


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base.get(k), v) if k in base else v
        return out
    return over


def render_chart(
    chart_dir: Path, values: Mapping[str, Any] | None = None, *, release: str = "argusdiff", namespace: str = "default"
) -> dict[str, str]:
    """``helm template RELEASE CHART_DIR --namespace NS -f values``: template path -> rendered text
    (templates that render to whitespace only are left out, as helm does; NOTES.txt too)."""
    chart_dir = Path(chart_dir)
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text(encoding="utf-8"))
    base = yaml.safe_load((chart_dir / "values.yaml").read_text(encoding="utf-8")) or {}
    root = {
        "Values": _merge(base, dict(values or {})),
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm", "IsInstall": True,
                    "IsUpgrade": False, "Revision": 1},
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart.get("appVersion", "")},
        "Files": _Files(chart_dir),
        "Capabilities": {"KubeVersion": {"Version": "v1.34.0", "Major": "1", "Minor": "34"}},
    }  # fmt: skip
    defines: dict[str, list[Node]] = {}
    parsed: dict[str, list[Node]] = {}
    templates = sorted((chart_dir / "templates").rglob("*"))
    for path in templates:
        if path.is_file() and path.suffix in (".yaml", ".yml", ".tpl", ".txt"):
            rel = str(path.relative_to(chart_dir))
            parsed[rel] = _parse(_lex(path.read_text(encoding="utf-8"), rel), rel, defines)
    r = _Renderer(defines, root)
    out: dict[str, str] = {}
    for rel, nodes in parsed.items():
        name = Path(rel).name
        if name.startswith("_") or name == "NOTES.txt":
            continue
        text = r.run(nodes, root, [{"$": root}])
        if text.strip():
            out[rel] = text
    return out
