"""`spade experiment`: arms (the SPADE loop, the fixed-environment baseline, variants) run from
the same base checkpoint, seed environments and eval seed on the same budget, each in its own
data dir; held-out evaluation at fixed versions; a report that sets them side by side with
intervals, the diversity of what each arm played and accepted, and the cost of it (DESIGN §11).

  layout.py   where an experiment and its arms live; the arm's config file
  state.py    what has run (resumable after a crash)
  budget.py   an arm's budget and how far it has got
  runner.py   `spade experiment run`: one arm's stack after another
  ledger.py   tokens and seconds per stage, per accepted environment, per point of score
  results.py  held-out scores per arm, suite and version, strict and lenient
  report.py   `spade experiment report`: tables, plots, JSON
"""
