"""The settings that choose the language of the lab's messages, read from the environment, and
the shape every settings module of the lab shares (`Setting`). It imports nothing, so that
any module of the lab, and this package's lookup first, can read it without waiting on torch."""

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """An environment variable the lab reads, its default, and what it changes."""

    name: str
    default: str
    help: str

    def get(self) -> str:
        """Return the variable's value here, or its default where it is unset."""
        return os.environ.get(self.name, self.default)


# The language of messages (labtext): --lang, else the notebook's, else these, in turn.
SESSION = Setting(
    "JPY_SESSION_NAME",
    "",
    "set by Jupyter in a kernel: the notebook it runs, whose language the kernel's messages take",
)
LANGUAGE = Setting(
    "LAB_LANG",
    "",
    "the language of messages where neither --lang nor the notebook names one: zh_CN (Chinese) "
    "or en; start-lab and the hub pass it on to the kernels",
)
LC_ALL = Setting("LC_ALL", "", "the locale, where LAB_LANG is unset: Chinese for zh*, else English")
LC_MESSAGES = Setting("LC_MESSAGES", "", "the locale of messages, where LC_ALL is unset")
LANG = Setting("LANG", "", "the locale, where LC_ALL and LC_MESSAGES are unset")
LOCALE = (LC_ALL, LC_MESSAGES, LANG)  # in the order they are read

ALL = (SESSION, LANGUAGE, *LOCALE)
