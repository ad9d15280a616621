"""Seeded synthetic text for benchmark prompts: policy prompts, questions, answers.

The text is built from word lists and sentence templates with a `random.Random`,
so a seed gives the same prompts on every machine, and it reads like the traffic an
assistant sees (rules, product questions, explanations) rather than random ids.
Lengths are measured in tokens with the model's own tokenizer by the caller.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

TOPICS = ("billing", "shipping", "returns", "account security", "data export", "scheduling",
          "the mobile app", "invoices", "team permissions", "backups", "notifications",
          "the API", "subscriptions", "privacy settings", "integrations", "reports")
NOUNS = ("customer", "order", "invoice", "password", "report", "device", "file", "project",
         "schedule", "message", "payment", "dashboard", "contract", "team", "server", "ticket")
ADJECTIVES = ("recent", "shared", "monthly", "urgent", "archived", "default", "secure",
              "large", "new", "duplicate", "missing", "annual", "private", "public")
VERBS = ("update", "cancel", "export", "share", "restore", "review", "delete", "verify",
         "rename", "merge", "schedule", "download", "upgrade", "transfer")
_ARTICLE = re.compile(r"\b([Aa]) ([aeiou])")
NAMES = ("Ada", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jun",
         "Kofi", "Lena", "Mateo", "Nia", "Omar", "Priya")

RULES = (
    "Always answer questions about {topic} in a friendly and concise way.",
    "If a {adj} {noun} cannot be found, ask the user for the {noun} number first.",
    "Never reveal another user's {noun} or any details about their {topic}.",
    "When a user wants to {verb} a {noun}, explain each step in order.",
    "Refer questions about {topic} that you cannot answer to the support team.",
    "Use plain language and avoid jargon when you explain {topic}.",
    "Confirm before you {verb} anything that affects a {adj} {noun}.",
    "Mention the help page on {topic} when it is relevant to the question.",
)
QUESTIONS = (
    "How do I {verb} a {adj} {noun}?",
    "Why can't I {verb} the {noun} from last week?",
    "What happens to my {noun} if I {verb} it?",
    "Can you explain how {topic} works for a {adj} {noun}?",
    "Is it possible to {verb} a {noun} without changing my {topic} settings?",
)
CONTEXT = (
    "My name is {name} and I manage {topic} for a small team.",
    "I tried to {verb} the {noun} twice but nothing changed.",
    "The {adj} {noun} was created by a colleague who left.",
    "We use {topic} every day, so this is quite important for us.",
)
ANSWERS = (
    "To {verb} a {noun}, open the {topic} page and choose the {adj} {noun} from the list.",
    "You can {verb} it from the settings; the change applies to every {adj} {noun}.",
    "That is expected: a {adj} {noun} is kept for thirty days before it is removed.",
    "First check your {topic} permissions, then try to {verb} the {noun} again.",
)


def _fill(rng: random.Random, template: str) -> str:
    text = template.format(topic=rng.choice(TOPICS), noun=rng.choice(NOUNS),
                           adj=rng.choice(ADJECTIVES), verb=rng.choice(VERBS),
                           name=rng.choice(NAMES))
    return _ARTICLE.sub(r"\1n \2", text)  # "a annual" -> "an annual"


def grow_text(rng: random.Random, templates: tuple[str, ...], target_tokens: int,
              count_tokens: Callable[[str], int], first: str = "") -> str:
    """Sentences from `templates` appended until the text has at least `target_tokens`."""
    text = first
    while not text or count_tokens(text) < target_tokens:
        sentence = _fill(rng, rng.choice(templates))
        for _ in range(8):  # prefer a sentence not used yet, as a person would
            if sentence not in text:
                break
            sentence = _fill(rng, rng.choice(templates))
        text = f"{text} {sentence}" if text else sentence
    return text


def system_prompt(rng: random.Random, target_tokens: int, count: Callable[[str], int]) -> str:
    company = rng.choice(NAMES) + rng.choice(("Soft", "Works", "Cloud", "Labs"))
    intro = f"You are the support assistant of {company}. Follow these rules:"
    return grow_text(rng, RULES, target_tokens, count, first=intro)


def question(rng: random.Random, target_tokens: int, count: Callable[[str], int]) -> str:
    """A user question: some context sentences, then the question itself."""
    ask = _fill(rng, rng.choice(QUESTIONS))
    missing = target_tokens - count(ask)
    return f"{grow_text(rng, CONTEXT, missing, count)} {ask}" if missing > 0 else ask


def answer(rng: random.Random, target_tokens: int, count: Callable[[str], int]) -> str:
    return grow_text(rng, ANSWERS, target_tokens, count)
