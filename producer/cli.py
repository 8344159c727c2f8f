"""`sandfarm`: a thin shell over library calls."""

from __future__ import annotations

from typing import Any

import click

from producer.commands import batch, evaluate, farm, jobs, local, report, tenants
from producer.commands.common import fail, redis_failure
from producer.protocol.errors import FarmError, IdConflictError
from sandbox_core.errors import SandfarmError


class Sandfarm(click.Group):
    """Any farm error a command did not handle itself is one line, never a traceback:
    exit 1 for the farm (unreachable, refused key, over quota), 2 for bad input."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FarmError as exc:
            fail(str(exc), 2 if isinstance(exc, IdConflictError) else 1)
        except SandfarmError as exc:  # a spec or policy refused
            fail(str(exc), 2)
        except Exception as exc:
            import redis  # loaded already by any command that reached Redis

            if not isinstance(exc, redis.RedisError):
                raise
            fail(redis_failure(exc), 1)


@click.group(cls=Sandfarm, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sandfarm")
def main() -> None:
    """sandfarm: run untrusted, agent-generated code in bounded sandboxes, at scale."""


local.register(main)
farm.register(main)
jobs.register(main)
tenants.register(main)
batch.register(main)
evaluate.register(main)
report.register(main)


if __name__ == "__main__":  # Python's own exit: profilers and debuggers can wrap it
    main()
