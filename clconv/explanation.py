"""What :meth:`clconv.plan.Plan.explain` returns: a record per pass, printed as a compact table.

A :class:`PassRecord` holds what a program may read of a pass's plan (algorithm, GEMM shape and
engine, chunks, split-K slices, workspace, launches) and names the rules that decided it; each
rule's story is told once, in the docs' algorithms page under ``rule-<name>``
(docs/guide/algorithms.md), never in the record. An :class:`Explanation` is the records with the
plan's header; as a string it is the table, at most ``WIDTH`` columns a line.
"""
from dataclasses import asdict, dataclass

WIDTH = 100        # columns of a printed line, at most
REASON_CHARS = 120  # characters of a record's reason, at most


class Reason(str):
    """A reason (its text, short) from the rule named ``rule`` (docs: ``rule-<rule>``)."""

    def __new__(cls, rule, text):
        self = super().__new__(cls, text)
        self.rule = rule
        return self


def short(text, most=REASON_CHARS):
    """``text`` cut to at most ``most`` characters (ending "..." where cut)."""
    text = str(text)
    return text if len(text) <= most else text[:most - 3].rstrip() + "..."


@dataclass(frozen=True)
class PassRecord:
    """One pass of a plan.

    ``gemm``: (M, N, K) of each of the pass's GEMMs (K the whole product's depth, before any
    split), () where it runs none; ``batch``: GEMMs in one grid (groups, images, transform points);
    ``chunks``: (chunks, images each), () where images run one by one in ``pieces``; ``pieces``:
    (pieces per image, size, unit: "output rows", "output columns" or "tile rows"), () for whole
    images (printed as 5x3r: 5 pieces of 3 output rows; "c" columns, "t" tile rows); ``splits``: split-K slices whose
    partial results are summed in order (1: none); ``math``: the dtype the pass computes in, or
    the math mode its GEMMs ran in (:mod:`clconv.precision`: "tf32", "fp16"), and the stored dtype
    where it differs; ``workspace``: bytes; ``launches``: the kernels the latest
    full run enqueued, None before the first; ``rules``: names of the rules that chose and shaped
    the pass; ``passed_over``: ((algorithm, rule), ...) taken before this one and passed over;
    ``reason``: why this algorithm, at most ``REASON_CHARS`` characters; ``notes``: short
    flags (operands read in place, packing, per-group queues, kernel forms).
    """
    pass_name: str
    algorithm: str
    engine: str
    gemm: tuple
    batch: int
    chunks: tuple
    pieces: tuple
    splits: int
    math: str
    workspace: int
    launches: tuple
    rules: tuple
    passed_over: tuple
    reason: str
    notes: tuple

    def lines(self):
        """The record as table lines (``WIDTH`` columns at most): its row, why, the rules
        (and what they passed over, and the notes), and once the pass has run its launches."""
        gemm = "x".join(map(str, self.gemm)) if self.gemm else "-"
        chunks = (f"{self.chunks[0]}x{self.chunks[1]}" if self.chunks else
                  f"{self.pieces[0]}x{self.pieces[1]}{_UNIT[self.pieces[2]]}" if self.pieces else "-")
        launched = "-" if self.launches is None else len(self.launches)
        row = (f"{_PASS[self.pass_name]:<6} {self.algorithm:<8} {self.engine or '-':<7} {gemm:<17} {self.batch:>5} "
               f"{chunks:>7} {self.splits:>5} {_bytes(self.workspace):>9} {launched:>8}")
        rules = "rules: " + (", ".join(self.rules) or "-")
        if self.passed_over:
            rules += "; not " + ", ".join(f"{name} ({rule})" for name, rule in self.passed_over)
        if self.notes:
            rules += "; " + ", ".join(self.notes)
        out = [row, "  why: " + self.reason, "  " + rules]
        if self.launches:
            out.append("  launched: " + _launches(self.launches))
        return [_fit(line) for line in out]


class Explanation(str):
    """A plan's records (``records``, in pass order; ``record(pass_name)``) and its header
    (``header``: shapes, options, dtype, math mode asked for (``math_request``) and run (``math``)
    and why, queues, GEMM engine and why); the string is the table."""

    def __new__(cls, header, records):
        self = super().__new__(cls, _table(header, records))
        self.header, self.records = dict(header), tuple(records)
        return self

    def record(self, pass_name):
        """The :class:`PassRecord` of ``pass_name``."""
        return next(r for r in self.records if r.pass_name == pass_name)

    def as_dict(self):
        """Header and records as plain data (for JSON)."""
        return {"header": dict(self.header), "passes": [asdict(r) for r in self.records]}


_UNIT = {"output rows": "r", "output columns": "c", "tile rows": "t"}
_PASS = {"forward": "fwd", "backward_input": "dgrad", "backward_weight": "wgrad"}
COLUMNS = (f"{'pass':<6} {'algo':<8} {'engine':<7} {'GEMM MxNxK':<17} {'batch':>5} {'chunks':>7} {'split':>5} "
           f"{'workspace':>9} {'launches':>8}")


def _table(h, records):
    def hw(v):
        return str(v[0]) if v[0] == v[1] else f"{v[0]},{v[1]}"
    (pt, pb), (pl, pr) = h["padding"]
    pad = str(pt) if pt == pb == pl == pr else f"{pt},{pb},{pl},{pr}"
    shape = lambda s: "x".join(map(str, s))   # noqa: E731
    head = (f"conv2d {shape(h['input'])} * {shape(h['weight'])} -> {shape(h['output'])} s{hw(h['stride'])} "
            f"p{pad} d{hw(h['dilation'])} g{h['groups']} {h['math']}, queues {h['queues']}")
    lines = [_fit(head), _fit(f"GEMMs on {h['gemm']}: {h['gemm_reason']}")]
    if h["math_request"] != "strict":
        lines.append(_fit(f"math {h['math_request']}: {h['math_reason']}"))
    lines.append(COLUMNS)
    for r in records:
        lines += r.lines()
    return "\n".join(lines)


def _fit(line):
    return line if len(line) <= WIDTH else line[:WIDTH - 3] + "..."


def _bytes(n):
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _launches(names):
    """"im2col_rows, gemm_cpu, cnhw_to_nchw_rows", repeats as "clblast_gemm x13"."""
    runs = []
    for name in names:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in runs)
