"""The `spade` console script: the root command and its tree of commands, assembled here; each
command lives in the module of its concern. Those modules import their heavy dependencies
(LanceDB, torch, transformers, matplotlib) inside the command, so `spade --help` stays fast."""

from __future__ import annotations

import typer

from spade_async.cli.bench.envs import bench_ladder, bench_sandbox, bench_validation
from spade_async.cli.bench.learn import bench_learn
from spade_async.cli.bench.memory import bench_memory, bench_report
from spade_async.cli.bench.serving import bench_endpoints, bench_inference, bench_pipeline
from spade_async.cli.bench.soak import bench_soak
from spade_async.cli.bench.trainer import bench_trainer
from spade_async.cli.config_cmd import show_config
from spade_async.cli.endpoints import endpoints_app
from spade_async.cli.env import env_app
from spade_async.cli.eval import evaluate
from spade_async.cli.experiment import experiment_app
from spade_async.cli.memory import memory_app
from spade_async.cli.model import model_app
from spade_async.cli.report import make_report
from spade_async.cli.run import run_daemon
from spade_async.cli.status import show_status
from spade_async.core.logs import configure_logging

app = typer.Typer(help="SPADE-async: self-play environment design on vLLM.", no_args_is_help=True,
                  pretty_exceptions_show_locals=False)  # locals may hold API keys


@app.callback()
def _main(
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error"),
) -> None:
    configure_logging(log_level)


# `spade --help` lists the commands in the order they are registered, then the groups.
app.command("config")(show_config)
app.command("status")(show_status)
app.command("eval")(evaluate)
app.command("report")(make_report)
app.command("run")(run_daemon)

# The bench group's commands live in four modules (spade_async.cli.bench), so it is put
# together here; the other groups are whole in their own modules.
bench_app = typer.Typer(help="Benchmarks: figures measured side by side in one run.",
                        no_args_is_help=True)
for name, command in (("memory", bench_memory), ("inference", bench_inference),
                      ("sandbox", bench_sandbox), ("ladder", bench_ladder),
                      ("pipeline", bench_pipeline), ("endpoints", bench_endpoints),
                      ("trainer", bench_trainer), ("learn", bench_learn),
                      ("validation", bench_validation), ("report", bench_report),
                      ("soak", bench_soak)):
    bench_app.command(name)(command)

app.add_typer(endpoints_app, name="endpoints")
app.add_typer(model_app, name="model")
app.add_typer(env_app, name="env")
app.add_typer(bench_app, name="bench")
app.add_typer(memory_app, name="memory")
app.add_typer(experiment_app, name="experiment")
