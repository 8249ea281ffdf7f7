"""The symbolic-engine tour: declare symbols, build shapes, prove facts, explain a contradiction."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

import dynshape as ds


def run_sym_demo(console: Console) -> None:
    batch = ds.sym("batch", min=1, max=64)
    seq = ds.sym("seq", min=1, max=512, multiple_of=8)
    H = ds.sym("H", min=32, max=1024, multiple_of=32)

    console.rule("[bold]symbols")
    for s in (batch, seq, H):
        console.print(f"  {s.atom().describe()}")

    console.rule("[bold]shapes")
    h = H
    for _ in range(5):  # a stride-2 conv + pool stack, symbolic all the way down
        h = (h + 2 * 1 - 3) // 2 + 1
    rows = [
        ("attention scores", (batch, 4, seq, seq)),
        ("flattened tokens", (batch * seq, 256)),
        ("reshape back (b*s*256)//256", ((batch * seq * 256) // 256,)),
        ("5 stride-2 convs on H", (ds.simplify(h),)),
        ("padded to 64", (ds.ceil_div(seq, 64) * 64,)),
    ]
    table = Table("what", "shape", "bounds of the last dim")
    for what, shape in rows:
        table.add_row(what, "(" + ", ".join(map(str, shape)) + ")", str(ds.bounds(shape[-1])))
    console.print(table)

    console.rule("[bold]proofs (True / False / None = undecided, never a guess)")
    facts = [
        ("(seq + 7)//8*8 == seq", ds.eq((seq + 7) // 8 * 8, seq)),
        ("seq % 8 == 0", ds.divides(8, seq)),
        ("batch*seq >= seq", batch * seq >= seq),
        ("ceil_div(seq, 64)*64 >= seq", ds.ceil_div(seq, 64) * 64 >= seq),
        ("batch <= seq", batch <= seq),
        ("H < 32", H < 32),
    ]
    for text, cond in facts:
        console.print(f"  {text:32s} -> {ds.prove(cond)}")

    console.rule("[bold]binding symbols from a real input shape")
    env = ds.solve([(batch, 3, "input 'x' axis 0"), (2 * seq, 256, "input 'x' axis 1")])
    console.print(f"  x.shape == (3, 256) against (batch, 2*seq) gives {env}")
    try:
        ds.solve([(batch, 3, "input 'x' axis 0"), (2 * seq, 250, "input 'x' axis 1")])
    except ds.ConstraintViolation as e:
        console.print(f"  x.shape == (3, 250): [red]{e}[/red]")

    console.rule("[bold]an explained contradiction")
    store = ds.ConstraintStore()
    store.declare(H, "input 'image' axis 2")
    try:
        store.equate(H, 100, "node Reshape_7 (target shape [1, 3, 100, 100])")
    except ds.ShapeError as e:
        console.print(f"[red]{e}[/red]")
