"""Where a loader's time goes (issue 46; docs/how-to/profile.md): the seconds each process of a
rank spends in each stage of a batch's life (`clock`), the training loop's exposed wait for
each batch (`waits`), the flat dict a loop logs (`report`), and the number of workers chosen
by measurement (`workers`)."""

from .clock import STAGES, StageClock
from .waits import Waits

__all__ = ["STAGES", "StageClock", "Waits"]
