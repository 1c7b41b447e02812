"""The commands of ``visualspec``, one module each (its parser beside its handler): each module's
``register(subparsers, common)`` adds its commands."""

from . import app, batch, bench, convert, evaluate, generate, prompts, text, train, video

# the order of ``visualspec --help``
COMMANDS = (generate, bench, batch, evaluate, prompts, train, video, text, convert, app)
