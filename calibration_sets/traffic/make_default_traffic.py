"""Write ``default-traffic.jsonl``: a synthetic traffic log for the embedded default model.

The log stands in for production traffic until a tenant supplies its own: one JSON object per
line, ``{"id", "class", "text"}``, with ``class`` one of chat, code, math, long_document and
tool_call, and ``text`` the whole prompt a user sent. Everything comes from material that is
legal to ship and available offline:

- chat, math, tool_call: text written here, from varied templates and a seeded RNG. The math
  problems are generated from our own templates with random numbers; no evaluation set
  (GSM8K in particular) is used, so calibration never sees the items the gate scores.
- code: functions and methods of the Python standard library (``inspect.getsource``, PSF
  licence) under instructions such as "Explain this function", "Find the bug" or "Add type
  hints", plus short questions, tracebacks and SQL requests written here.
- long_document: sections of the Python language reference (``pydoc_data.topics``, PSF
  licence) under summarise / extract / quiz instructions, plus generated logs, CSV exports
  and meeting transcripts.

Deterministic: one fixed seed, no clock, no set iteration, standard library only. Re-running
it gives a byte-identical file on the same Python version (the stdlib source and the pydoc
topics are part of the input, so another patch release of Python may change a few records;
``GENERATED_WITH`` records the version the committed file was made with).

    python calibration_sets/traffic/make_default_traffic.py [--out PATH]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import textwrap
from pathlib import Path
from random import Random

SEED = 20240611
GENERATED_WITH = "3.11.7"
OUT = Path(__file__).resolve().parent / "default-traffic.jsonl"
COUNTS = {"chat": 150, "code": 100, "math": 80, "long_document": 80, "tool_call": 90}

NAMES = [
    "Priya",
    "Marcus",
    "Sofia",
    "Kenji",
    "Amara",
    "Lukas",
    "Chloe",
    "Diego",
    "Fatima",
    "Noah",
    "Ingrid",
    "Tomas",
    "Mei",
    "Olu",
    "Hannah",
    "Rafael",
    "Aisha",
    "Jonas",
    "Elena",
    "Sam",
]
CITIES = [
    "Lisbon",
    "Osaka",
    "Toronto",
    "Nairobi",
    "Buenos Aires",
    "Krakow",
    "Melbourne",
    "Reykjavik",
    "Seoul",
    "Mexico City",
    "Edinburgh",
    "Cape Town",
    "Hanoi",
    "Denver",
    "Marrakesh",
    "Copenhagen",
    "Lima",
    "Istanbul",
    "Vancouver",
    "Singapore",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
LANGS = ["Spanish", "French", "German", "Japanese", "Portuguese", "Italian", "Korean", "Dutch", "Polish"]
PROG_LANGS = ["JavaScript", "TypeScript", "Go", "Rust", "Java", "C#", "Kotlin"]
PROJECTS = [
    "the billing migration",
    "the Q3 roadmap",
    "the onboarding redesign",
    "the data warehouse move",
    "the mobile app launch",
    "the vendor audit",
    "the pricing experiment",
    "the support backlog",
]


def casual(rng: Random, text: str) -> str:
    """Real users often skip capitals and final punctuation."""
    if rng.random() < 0.25:
        text = text[0].lower() + text[1:]
        text = text.rstrip("?.!")
    return text


# ---------------------------------------------------------------------------------------- chat

DIFFS = [
    ("baking soda", "baking powder"),
    ("weather", "climate"),
    ("a virus", "a bacterium"),
    ("stocks", "bonds"),
    ("affect", "effect"),
    ("RAM", "storage"),
    ("an LLC", "a sole proprietorship"),
    ("espresso", "drip coffee"),
    ("a crocodile", "an alligator"),
    ("empathy", "sympathy"),
    ("a Roth IRA", "a traditional IRA"),
    ("jam", "jelly"),
]
IDEAS = [
    "a rainy-day activity with two kids under six",
    "a 30th birthday party on a budget",
    "a team offsite for twelve engineers",
    "a sci-fi short story set on a generation ship",
    "a name for a neighbourhood bakery",
    "a podcast about local history",
    "a low-effort weeknight dinner",
    "a science fair project for a 12-year-old",
    "a gift for a coworker who is retiring",
    "a blog post about learning to swim as an adult",
]
HOWTOS = [
    "get red wine out of a wool carpet",
    "politely decline a wedding invitation",
    "start running at 40 without hurting my knees",
    "keep basil alive on a windowsill",
    "negotiate a higher starting salary",
    "stop procrastinating on my thesis",
    "fall asleep faster",
    "clean a cast iron pan that has rust on it",
    "prepare for a behavioural interview",
    "tell my landlord the heating is broken again",
    "teach my dog to stop pulling on the leash",
    "make friends after moving to a new city",
]
ELI = [
    "how vaccines work",
    "inflation",
    "black holes",
    "compound interest",
    "photosynthesis",
    "how the internet routes packets",
    "why the sky is blue",
    "how a mortgage works",
    "what a blockchain is",
    "how noise-cancelling headphones work",
    "why we have leap years",
    "how credit scores are calculated",
]
CLASSICS = [
    "Pride and Prejudice",
    "Moby-Dick",
    "Frankenstein",
    "The Odyssey",
    "Jane Eyre",
    "The Count of Monte Cristo",
    "Crime and Punishment",
    "Don Quixote",
    "Middlemarch",
    "Dracula",
]
PHRASES = [
    "Where is the nearest train station?",
    "I'm allergic to peanuts.",
    "Could we have the bill, please?",
    "Happy birthday, I hope all your wishes come true!",
    "The meeting has been moved to Thursday.",
    "Thank you for your hospitality.",
]
SUBJECTS = [
    "the first snow",
    "a cat asleep in the sun",
    "Monday mornings",
    "an old lighthouse",
    "the smell of rain",
    "a forgotten umbrella",
    "city lights at night",
]
ONE_LINERS = [
    "What's a good name for a golden retriever puppy?",
    "Is it rude to leave a party without saying goodbye?",
    "How long should I boil an egg for a runny yolk?",
    "What year did the Berlin Wall fall?",
    "Tell me a fun fact about octopuses.",
    "Why do cats purr?",
    "hi",
    "thanks, that helped!",
    "Can you help me write a toast for my sister's wedding?",
    "What should I read next if I loved Dune?",
    "Which is healthier, brown rice or quinoa?",
    "How many cups are in a litre?",
    "Suggest a 20 minute stretching routine for after work.",
    "What does 'per my last email' really mean?",
    "Is a tomato a fruit or a vegetable?",
    "give me a motivational quote for exam week",
]


def chat_short(rng: Random) -> str:
    """A one-line chat request (differences, ideas, how-tos, ...), from a template."""
    kind = rng.randrange(10)
    if kind == 0:
        a, b = rng.choice(DIFFS)
        text = f"What's the difference between {a} and {b}?"
    elif kind == 1:
        text = f"Give me {rng.randint(3, 10)} ideas for {rng.choice(IDEAS)}."
    elif kind == 2:
        text = f"How do I {rng.choice(HOWTOS)}?"
    elif kind == 3:
        text = f'Translate "{rng.choice(PHRASES)}" into {rng.choice(LANGS)}.'
    elif kind == 4:
        text = f"Write a haiku about {rng.choice(SUBJECTS)}."
    elif kind == 5:
        text = f"Explain {rng.choice(ELI)} like I'm {rng.choice(['five', '10', 'a high schooler', 'my grandma'])}."
    elif kind == 6:
        text = f"Can you recommend {rng.randint(3, 6)} books similar to {rng.choice(CLASSICS)}?"
    elif kind == 7:
        text = f"Summarize the plot of {rng.choice(CLASSICS)} in {rng.choice(['two sentences', 'one paragraph', 'five bullet points'])}."
    else:
        text = rng.choice(ONE_LINERS)
    return casual(rng, text)


ROLES = [
    "nurse working night shifts",
    "junior data analyst",
    "high school teacher",
    "freelance designer",
    "first-time manager of a team of five",
    "PhD student in chemistry",
    "small bakery owner",
    "software engineer two years into my first job",
    "single parent of two",
    "retired accountant",
]
SITUATIONS = [
    "my manager keeps scheduling meetings during my focus time",
    "a coworker keeps taking credit for my work in front of the team",
    "I was offered a promotion but it means relocating",
    "I have three deadlines next week and I can't move any of them",
    "my best friend asked to borrow a large amount of money",
    "I've been feeling burnt out for about two months",
    "I want to switch careers but I'm worried about the pay cut",
    "my neighbour's dog barks every night from 11 until 2",
]
DETAILS = [
    "I've already tried talking to them once, but nothing changed.",
    "I don't want to damage the relationship.",
    "Money is a bit tight this year, so I need to be careful.",
    "I tend to avoid conflict, which probably makes this worse.",
    "My partner thinks I'm overreacting.",
    "I have about a month before I need to decide.",
    "I'd like to handle this without involving HR if possible.",
    "Honestly I'm not sure whether I'm the problem here.",
    "It's starting to affect my sleep.",
]
BACKGROUND = [
    "I've been in this job for about three years and until recently I really liked it.",
    "we're a small team, so everyone notices when something is off.",
    "I moved here last year and don't have many people to ask for advice locally.",
    "this has happened before at a previous job and I handled it badly, so I want to get it right this time.",
    "my contract is up for renewal in the spring.",
]
TRIP_CONSTRAINTS = [
    "no early mornings, we're on holiday",
    "one day trip outside the city would be nice",
    "we don't drive",
    "one of us uses a wheelchair, so step-free places please",
    "we want at least one really nice dinner",
    "avoid tourist traps if possible",
    "we arrive late on the first day",
    "it's our anniversary on the third day",
]
WEEK_BITS = [
    "office 9-6, then free",
    "work from home, flexible",
    "kids' football practice until 7",
    "late shift, finish at 10pm",
    "usually free",
    "family lunch, busy until 4",
    "long commute, home at 8",
]
INTERESTS = [
    "food markets",
    "museums",
    "hiking",
    "live music",
    "architecture",
    "beaches",
    "street art",
    "vintage shopping",
    "wine",
    "photography",
]
INGREDIENTS = [
    "chickpeas",
    "spinach",
    "half a bag of rice",
    "two eggs",
    "feta",
    "a can of tomatoes",
    "leeks",
    "frozen peas",
    "chicken thighs",
    "tofu",
    "coconut milk",
    "lemons",
    "ginger",
    "sweet potatoes",
]


def email_body(rng: Random, sender: str) -> str:
    """A sloppy work email from ``sender``, for rewrite requests."""
    who = rng.choice(NAMES)
    project = rng.choice(PROJECTS)
    lines = [
        f"hey {who},",
        "",
        (
            f"so about {project}, we're behind, like 2 weeks maybe more. "
            f"the vendor didnt send the files until {rng.choice(MONTHS)} {rng.randint(2, 28)} and then half were wrong."
        ),
        rng.choice(
            [
                "i know you wanted it done by end of month but thats not happening.",
                "can we push the review? i dont think anyone is ready.",
                "i need someone from finance to sign off before we can continue, can you ask around.",
            ]
        ),
        rng.choice(
            [
                "also the budget is going to be over by like 15%, sorry.",
                "also Jonas is out next week so we're even shorter.",
                "also the client called twice asking for an update and i didnt know what to say.",
            ]
        ),
        "let me know what you think",
        "",
        sender,
    ]
    return "\n".join(lines)


def chat_medium(rng: Random) -> str:
    """A medium-length chat request: a text of the user's to rework, or a question with its follow-up."""
    kind = rng.randrange(7)
    if kind == 0:
        return (
            f"Can you make this email sound more professional but still friendly? "
            f"It's going to my {rng.choice(['boss', 'client', 'team lead', 'director'])}.\n\n"
            + email_body(rng, rng.choice(NAMES))
        )
    if kind == 1:
        details = " ".join(rng.sample(DETAILS, rng.randint(3, 6)))
        return (
            f"I'm a {rng.choice(ROLES)} and {rng.choice(SITUATIONS)}. {details} For context, "
            f"{rng.choice(BACKGROUND)} "
            f"What would you do in my position? Please be honest, not just reassuring, and if you think "
            f"I'm missing something obvious, say so."
        )
    if kind == 2:
        days, city = rng.randint(2, 10), rng.choice(CITIES)
        who = rng.choice(
            ["my partner", "two friends", "my parents (both in their 70s)", "a toddler", "nobody, solo trip"]
        )
        likes = ", ".join(rng.sample(INTERESTS, 3))
        return (
            f"I'm planning a {days}-day trip to {city} in {rng.choice(MONTHS)} with {who}. "
            f"We like {likes}. Budget is around {rng.randint(8, 40) * 100} euros excluding flights. "
            f"We don't want to rush, so max two big things per day. Some constraints:\n"
            + "\n".join("- " + c for c in rng.sample(TRIP_CONSTRAINTS, rng.randint(2, 5)))
            + "\nCan you suggest a day-by-day itinerary, and tell me which neighbourhood to stay in?"
        )
    if kind == 3:
        items = ", ".join(rng.sample(INGREDIENTS, rng.randint(4, 8)))
        diet = rng.choice(
            ["One of us is vegetarian.", "No dairy please.", "My kid hates anything spicy.", ""]
        )
        return (
            f"I have these ingredients: {items}. Also the usual pantry stuff (oil, salt, pepper, some dried "
            f"herbs, flour). What can I cook for {rng.randint(2, 6)} people in under "
            f"{rng.choice([20, 30, 45, 60])} minutes? {diet} I only have "
            f"{rng.choice(['one pot and a frying pan', 'a microwave and a hob', 'an oven and one baking tray'])}, "
            f"and we already had pasta twice this week. Give me the steps, and tell me what I could prep "
            f"ahead if guests are late."
        ).replace("  ", " ")
    if kind == 4:
        goal = rng.choice(
            ["run a 10k", "do ten pull-ups", "lose 5 kg", "improve my posture", "get back into swimming"]
        )
        return (
            f"I want to {goal} in the next {rng.randint(6, 16)} weeks. I currently exercise "
            f"{rng.choice(['not at all', 'once a week', 'two or three times a week'])}, I'm {rng.randint(22, 61)} "
            f"and I can train {rng.choice(['mornings only', 'after 7pm', 'on weekends mostly'])}. "
            f"I had a {rng.choice(['knee', 'lower back', 'shoulder'])} injury a couple of years ago. "
            "Here's what a normal week looks like for me:\n"
            + "\n".join(
                f"{d}: {rng.choice(WEEK_BITS)}" for d in ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
            )
            + "\nCan you make me a weekly plan that fits around this and explain how to progress it?"
        )
    if kind == 5:
        paras = "\n\n".join(
            p.format(**cover_fill(rng)) for p in rng.sample(COVER_PARAS[:5], rng.randint(1, 3))
        )
        return (
            f"Can you tighten this {rng.choice(['paragraph', 'part'])} of my "
            f"{rng.choice(['personal statement', 'cover letter', 'LinkedIn summary'])}? It feels wordy. "
            f"Keep my voice.\n\n{paras}"
        )
    topic = rng.choice(ELI)
    return (
        f"User: can you explain {topic}?\n"
        f"Assistant: Sure. In short, it comes down to a few key ideas, which I'll go through one at a time. "
        f"Do you want the simple version or a more technical one?\n"
        f"User: the technical one please, I'm studying for an exam on this. Include the main equations or "
        f"mechanisms if there are any, and tell me what examiners usually try to trip people up on."
    )


MEETING_TOPICS = [
    "hiring plan",
    "release date",
    "on-call rotation",
    "customer churn numbers",
    "office move",
    "security review findings",
    "budget for Q4",
    "design system adoption",
    "API deprecation",
]


def meeting_notes(rng: Random, lines: int) -> str:
    """Meeting notes of ``lines`` action lines, names and topics drawn at random."""
    out = [
        f"Weekly sync, {rng.choice(MONTHS)} {rng.randint(1, 28)}",
        "Attendees: " + ", ".join(rng.sample(NAMES, rng.randint(4, 7))),
    ]
    for _ in range(lines):
        who, topic = rng.choice(NAMES), rng.choice(MEETING_TOPICS)
        out.append(
            rng.choice(
                [
                    f"- {who} said the {topic} is still blocked on legal, ETA unclear",
                    f"- {topic}: agreed to revisit next week, {who} to collect numbers",
                    f"- {who} raised concerns about the {topic}, nobody had answers",
                    f"- decision: go ahead with option B for the {topic} ({who} disagreed)",
                    f"- {who} will draft a one-pager on the {topic} by Friday",
                    f"- long discussion on the {topic}, no conclusion, {who} thinks we need more data",
                    f"- {who}: the numbers for the {topic} look better than last month (+{rng.randint(2, 19)}%)",
                ]
            )
        )
    return "\n".join(out)


COVER_PARAS = [
    (
        "I am writing to apply for the {role} position at {company}. I have spent the last {years} years working "
        "in {field}, where I learned how much good work depends on clear communication and careful follow-through. "
        "When I saw this opening I immediately thought it matched both my experience and what I want to do next."
    ),
    (
        "In my current role at {other}, I lead a small team responsible for {duty}. Over the past year we reduced "
        "turnaround time by {pct} percent by rethinking how requests were prioritised, and I personally introduced "
        "a weekly review that caught several costly mistakes before they reached customers."
    ),
    (
        "Before that, I worked at {other2} as a {junior}, which taught me to stay calm under pressure and to learn "
        "new tools quickly. I was often the person colleagues came to when something unusual happened, and I "
        "enjoyed figuring out the root cause rather than just patching the symptom."
    ),
    (
        "What draws me to {company} specifically is your focus on {value}. I have followed your work for a while, "
        "and I particularly admired how you handled {event}. I would love to contribute to a team that takes "
        "that kind of care."
    ),
    (
        "Outside of work I volunteer with a local {charity}, where I coordinate schedules for about {n} volunteers. "
        "It has made me much better at planning around people's real constraints instead of ideal ones."
    ),
    (
        "Thank you for considering my application. I would welcome the chance to discuss how my background could "
        "help {company} and I am available for a conversation at your convenience."
    ),
]


def cover_fill(rng: Random) -> dict:
    """Random values for the cover letter's template fields."""
    return {
        "role": rng.choice(
            ["Operations Manager", "Data Analyst", "Product Designer", "Customer Success Lead"]
        ),
        "company": rng.choice(["Northwind", "Brightleaf Health", "Atlas Logistics", "Kestrel Software"]),
        "years": rng.randint(3, 15),
        "field": rng.choice(["logistics", "healthcare administration", "retail analytics"]),
        "other": rng.choice(["Bluebird Supply", "Meridian Clinics", "Harbor & Co"]),
        "pct": rng.randint(10, 45),
        "duty": rng.choice(["vendor onboarding", "monthly reporting", "customer escalations"]),
        "other2": rng.choice(["a regional bank", "a call centre", "a university library"]),
        "junior": rng.choice(["coordinator", "analyst", "assistant"]),
        "value": rng.choice(["sustainability", "accessibility", "transparent pricing"]),
        "event": rng.choice(["last year's product recall", "the switch to remote work", "your rebrand"]),
        "charity": rng.choice(["food bank", "literacy programme", "animal shelter"]),
        "n": rng.randint(20, 80),
    }


def cover_letter(rng: Random) -> str:
    """A filled-in cover letter, for proofreading requests."""
    fill = cover_fill(rng)
    paras = [p.format(**fill) for p in COVER_PARAS]
    return "Dear Hiring Manager,\n\n" + "\n\n".join(paras) + f"\n\nSincerely,\n{rng.choice(NAMES)}"


REVIEW_BITS = [
    "battery dies after a few hours",
    "arrived quickly and well packed",
    "the app keeps disconnecting",
    "customer service never replied",
    "sound quality is great for the price",
    "strap broke after a month",
    "setup took forever",
    "exactly as described",
    "the manual is useless",
    "much lighter than expected",
    "charging port feels loose",
    "would buy again",
    "firmware update fixed most issues",
]


def chat_long(rng: Random, docs: list[str]) -> str:
    """A chat request around a long text: a cover letter, customer reviews or a reference excerpt."""
    kind = rng.randrange(4)
    if kind == 0:
        return (
            "Please proofread my cover letter. Point out anything awkward or too generic, then give me an "
            "improved version. Keep it under one page.\n\n" + cover_letter(rng)
        )
    if kind == 1:
        return (
            "Turn these meeting notes into a clean summary for people who weren't there: decisions, open "
            "questions and action items with owners.\n\n" + meeting_notes(rng, rng.randint(25, 45))
        )
    if kind == 2:
        reviews = []
        for i in range(rng.randint(14, 24)):
            bits = "; ".join(rng.sample(REVIEW_BITS, rng.randint(1, 3)))
            reviews.append(
                f"{i + 1}. ({rng.randint(1, 5)} stars) {bits}. Bought it for my "
                f"{rng.choice(['commute', 'gym sessions', 'son', 'home office', 'travel'])}."
            )
        return (
            "Here are the latest customer reviews for our wireless earbuds. What are the three most common "
            "complaints, and what should we fix first?\n\n" + "\n".join(reviews)
        )
    doc = rng.choice(docs)
    start = rng.randrange(0, max(1, len(doc) - 2600))
    excerpt = doc[start : start + rng.randint(1800, 3200)]
    return (
        "I'm learning Python and reading the official docs but I don't get this part at all. Can you explain "
        'it in plain English with a small example?\n\n"""\n' + excerpt.strip() + '\n"""'
    )


# ---------------------------------------------------------------------------------------- code

CODE_MODULES = [
    "textwrap",
    "shlex",
    "difflib",
    "fnmatch",
    "posixpath",
    "base64",
    "heapq",
    "bisect",
    "calendar",
    "colorsys",
    "statistics",
    "fractions",
    "ipaddress",
    "urllib.parse",
    "html",
    "glob",
    "shutil",
    "string",
    "json.encoder",
    "email.utils",
    "mimetypes",
    "gettext",
    "pprint",
    "copy",
    "functools",
    "dataclasses",
    "configparser",
    "argparse",
    "tokenize",
    "netrc",
    "ntpath",
    "graphlib",
    "ast",
]


def stdlib_functions() -> list[tuple[str, str]]:
    """(qualified name, dedented source) of stdlib functions and methods of a useful size."""
    found = []
    for mod_name in CODE_MODULES:
        module = importlib.import_module(mod_name)
        for name, obj in sorted(vars(module).items()):
            candidates = []
            if inspect.isfunction(obj) and obj.__module__ == mod_name:
                candidates.append((f"{mod_name}.{name}", obj))
            elif inspect.isclass(obj) and obj.__module__ == mod_name:
                for mname, meth in sorted(vars(obj).items()):
                    if inspect.isfunction(meth):
                        candidates.append((f"{mod_name}.{name}.{mname}", meth))
            for qual, fn in candidates:
                try:
                    src = textwrap.dedent(inspect.getsource(fn))
                except (OSError, TypeError):
                    continue
                if 250 <= len(src) <= 6500:
                    found.append((qual, src))
    return found


MUTATIONS = [
    (" < ", " <= "),
    (" <= ", " < "),
    (" == ", " != "),
    (" + 1", " - 1"),
    ("[1:]", "[:-1]"),
    (" and ", " or "),
    (" is None", " is not None"),
    ("return True", "return False"),
    (" - 1", " + 1"),
]


def inject_bug(rng: Random, src: str) -> str | None:
    """``src`` with one plausible bug (``MUTATIONS``) put in; None when no mutation applies."""
    options = [m for m in MUTATIONS if m[0] in src]
    if not options:
        return None
    old, new = rng.choice(options)
    positions = [i for i in range(len(src)) if src.startswith(old, i)]
    at = rng.choice(positions)
    return src[:at] + new + src[at + len(old) :]


CODE_QUESTIONS = [
    "How do I reverse a list in Python without modifying the original?",
    "What's the difference between `is` and `==` in Python?",
    "Write a regex that matches UK postcodes.",
    "What does `yield from` do?",
    "How do I read a CSV file with pandas and skip the first two rows?",
    "git: how do I undo my last commit but keep the changes?",
    "Write a bash one-liner that finds the 10 largest files under the current directory.",
    "What's the idiomatic way to merge two dicts in Python 3.11?",
    "Why is my React component rendering twice in development?",
    "How do I center a div horizontally and vertically with flexbox?",
    "In SQL, what's the difference between WHERE and HAVING?",
    "Explain Python's GIL in two paragraphs.",
    "how to make a python venv on windows",
    "What is a closure? Give a JavaScript example.",
    "Convert a Unix timestamp to ISO 8601 in Go.",
    "Is `list.sort()` stable in Python?",
    "How do I profile a slow Python script?",
    "Write a Dockerfile for a small Flask app.",
    "What does `SELECT ... FOR UPDATE` lock in Postgres?",
    "Why does 0.1 + 0.2 != 0.3 in most languages?",
]
TRACEBACKS = [
    (
        "KeyError: 'user_id'",
        "def handler(event):\n    body = json.loads(event['body'])\n    return body['user_id']",
    ),
    (
        "TypeError: unsupported operand type(s) for +: 'int' and 'str'",
        "total = 0\nfor row in rows:\n    total = total + row[2]\nprint(total)",
    ),
    (
        "IndexError: list index out of range",
        "for i in range(len(items)):\n    if items[i] == items[i + 1]:\n        dupes.append(items[i])",
    ),
    (
        "AttributeError: 'NoneType' object has no attribute 'group'",
        "m = re.match(r'v(\\d+)', tag)\nmajor = int(m.group(1))",
    ),
    (
        "RecursionError: maximum recursion depth exceeded",
        (
            "def flatten(x):\n    if isinstance(x, list):\n        return [y for item in x for y in flatten(item)]\n"
            "    return flatten([x])"
        ),
    ),
    (
        "UnboundLocalError: cannot access local variable 'count' where it is not associated with a value",
        "count = 0\ndef bump():\n    count += 1\n    return count",
    ),
]
SQL_TASKS = [
    "the top 10 customers by total revenue in 2023",
    "monthly active users for the last 12 months",
    "orders that have no order items",
    "products that were never ordered",
    "the share of users who ordered again within 30 days of their first order",
    "average order value per country, only countries with at least 50 orders",
]
SCHEMA = """CREATE TABLE users (id bigint primary key, email text not null, country char(2), created_at timestamptz);
CREATE TABLE orders (id bigint primary key, user_id bigint references users(id), status text,
                     total_cents integer, created_at timestamptz);
CREATE TABLE order_items (order_id bigint references orders(id), product_id bigint, quantity integer);
CREATE TABLE products (id bigint primary key, name text, category text, price_cents integer);"""


def code_short(rng: Random) -> str:
    """A short code question: a casual question, a traceback, or a function to write."""
    kind = rng.randrange(3)
    if kind == 0:
        return casual(rng, rng.choice(CODE_QUESTIONS))
    if kind == 1:
        err, snippet = rng.choice(TRACEBACKS)
        return f"why am I getting `{err}` here?\n```python\n{snippet}\n```"
    return (
        f"Write a {rng.choice(['Python', 'JavaScript', 'Go'])} function that "
        + rng.choice(
            [
                "checks whether a string is a palindrome, ignoring punctuation",
                "returns the n-th Fibonacci number iteratively",
                "groups a list of words by their first letter",
                "deduplicates a list while keeping order",
                "parses a duration like '1h30m' into seconds",
            ]
        )
        + "."
    )


def code_with_source(rng: Random, qual: str, src: str) -> str:
    """An instruction (explain, type hints, find the bug, ...) around a stdlib function's source."""
    fence = f"```python\n{src.rstrip()}\n```"
    kind = rng.randrange(10)
    if kind == 0:
        return f"Explain what this function does, step by step:\n\n{fence}"
    if kind == 1:
        return f"Can you add type hints to this? Keep the behaviour identical.\n\n{fence}"
    if kind == 2:
        buggy = inject_bug(rng, src)
        if buggy is not None:
            return (
                "There's a bug somewhere in this function, it gives wrong results on some inputs. "
                f"Can you find it and explain the fix?\n\n```python\n{buggy.rstrip()}\n```"
            )
        return f"Is there any edge case where this function misbehaves?\n\n{fence}"
    if kind == 3:
        return (
            f"Write pytest unit tests for the following function from `{qual.rsplit('.', 1)[0]}`:\n\n{fence}"
        )
    if kind == 4:
        return f"Refactor this for readability without changing behaviour:\n{fence}"
    if kind == 5:
        return f"What is the time complexity of this code?\n\n{src.rstrip()}"
    if kind == 6:
        return f"Rewrite this in {rng.choice(PROG_LANGS)}, idiomatically:\n\n{fence}"
    if kind == 7:
        return f"Write a Google-style docstring for `{qual.rsplit('.', 1)[-1]}`:\n\n{fence}"
    if kind == 8:
        return f"Review this code like a senior engineer would in a pull request.\n\n{fence}"
    return f"{src.rstrip()}\n\nwhat does this do"


def code_sql(rng: Random) -> str:
    """A SQL request against the fixed Postgres schema."""
    return (
        f"Given this Postgres schema:\n\n{SCHEMA}\n\nWrite a query for {rng.choice(SQL_TASKS)}. "
        "Explain any window functions you use."
    )


# ---------------------------------------------------------------------------------------- math


def math_problem(rng: Random) -> str:
    """One word or equation problem from our own templates (never an evaluation set's item)."""
    r = rng.randint
    kind = rng.randrange(22)
    name, other = rng.sample(NAMES, 2)
    if kind == 0:
        return f"Solve for x: {r(2, 12)}x + {r(1, 40)} = {r(41, 200)}"
    if kind == 1:
        return (
            f"A train leaves {rng.choice(CITIES)} at {r(5, 11)}:{rng.choice(['00', '15', '30', '45'])} travelling "
            f"at {r(60, 140)} km/h. A second train leaves the same station {r(1, 3)} hours later at "
            f"{r(141, 220)} km/h on a parallel track. When does the second train catch up?"
        )
    if kind == 2:
        return (
            f"{name} buys {r(3, 9)} notebooks at ${r(2, 6)}.{r(10, 99)} each and {r(2, 5)} pens at "
            f"${r(1, 3)}.{r(10, 99)} each, and pays with a ${rng.choice([20, 50, 100])} bill. How much change does {name} get?"
        )
    if kind == 3:
        return f"What is {r(11, 95)}% of {r(120, 9800)}?"
    if kind == 4:
        return (
            f"If I invest ${r(10, 200) * 100} at {r(2, 9)}.{r(0, 9)}% annual interest compounded "
            f"{rng.choice(['monthly', 'quarterly', 'annually'])}, how much will I have after {r(3, 30)} years?"
        )
    if kind == 5:
        return (
            f"{name} can paint a fence in {r(3, 9)} hours and {other} can paint it in {r(4, 12)} hours. "
            "How long does it take if they work together?"
        )
    if kind == 6:
        a, b = r(2, 9), r(2, 9)
        return f"Find the derivative of f(x) = {a}x^{b} * sin(x) + ln(x^2 + {r(1, 9)})."
    if kind == 7:
        return f"Evaluate the integral of {r(1, 9)}x^{r(2, 5)} - {r(1, 9)}x + {r(1, 9)} from {r(0, 2)} to {r(3, 6)}."
    if kind == 8:
        n, k = r(5, 15), r(2, 4)
        return f"In how many ways can a committee of {k} be chosen from {n} people if two particular people refuse to serve together?"
    if kind == 9:
        nums = ", ".join(str(r(1, 99)) for _ in range(r(6, 14)))
        return f"Find the mean, median, mode and sample standard deviation of: {nums}"
    if kind == 10:
        rows = [[r(-5, 9) for _ in range(3)] for _ in range(3)]
        return f"Compute the determinant of the matrix {rows} and say whether it is invertible."
    if kind == 11:
        return (
            f"What is {r(2, 9)}^{r(20, 200)} mod {rng.choice([7, 11, 13, 17, 19, 23])}? Show your reasoning."
        )
    if kind == 12:
        return (
            f"Two dice are rolled. What is the probability that the sum is at least {r(7, 11)} "
            f"given that at least one die shows a {r(1, 6)}?"
        )
    if kind == 13:
        return (
            f"A rectangle's length is {r(2, 5)} cm more than {r(2, 3)} times its width. Its perimeter is "
            f"{r(30, 120)} cm. Find its area."
        )
    if kind == 14:
        return f"Convert {r(3, 95)} miles per hour to metres per second, to two decimal places."
    if kind == 15:
        return f"Solve the system:\n  {r(1, 6)}x + {r(1, 6)}y = {r(5, 40)}\n  {r(1, 6)}x - {r(1, 6)}y = {r(-10, 20)}"
    if kind == 16:
        return rng.choice(
            [
                "Prove that the sum of the first n odd numbers is n^2.",
                "Prove that sqrt(2) is irrational.",
                "Show that there are infinitely many primes.",
                "Prove by induction that 3 divides n^3 - n for every natural number n.",
            ]
        )
    if kind == 17:
        return (
            f"A shop raises a price by {r(5, 30)}% and then offers a {r(5, 30)}% discount on the new price. "
            "Is the final price higher or lower than the original, and by what percent?"
        )
    if kind == 18:
        a1, d = r(1, 20), r(2, 9)
        return f"What is the sum of the first {r(20, 100)} terms of the arithmetic sequence {a1}, {a1 + d}, {a1 + 2 * d}, ...?"
    if kind == 19:
        return (
            f"$\\lim_{{x \\to 0}} \\frac{{\\sin({r(2, 9)}x)}}{{{r(2, 9)}x}}$ = ? "
            "explain without L'Hopital if possible"
        )
    if kind == 20:
        return (
            f"{name} is {r(2, 6)} times as old as {other}. In {r(4, 15)} years {name} will be twice as old "
            f"as {other}. How old are they now?"
        )
    return (
        f"A recipe for {r(4, 6)} people needs {r(200, 600)} g of flour and {r(2, 4)} eggs. "
        f"How much of each do I need for {r(7, 15)} people? Round eggs sensibly."
    )


def math_problem_set(rng: Random) -> str:
    """A homework sheet of several ``math_problem``s under one instruction."""
    n = rng.randint(8, 18)
    head = rng.choice(
        [
            "Here's my homework, please solve each and show working:",
            "Practice problems for Thursday's quiz. Give full solutions so I can check mine.",
            "Can you check my answers? Problems first, then what I got.",
        ]
    )
    problems = [f"{i + 1}. {math_problem(rng)}" for i in range(n)]
    text = head + "\n\n" + "\n\n".join(problems)
    if head.startswith("Can you check"):
        text += "\n\nMy answers: " + ", ".join(f"({i + 1}) {rng.randint(-20, 400)}" for i in range(n))
    return text


def math_story(rng: Random) -> str:
    """A multi-step word problem about an orchard's accounts."""
    name = rng.choice(NAMES)
    crates, per = rng.randint(12, 40), rng.randint(18, 36)
    return (
        f"{name} runs a small orchard. This season {name} picked {crates} crates of apples with about {per} kg "
        f"per crate. {rng.randint(10, 25)}% of the apples were bruised and sold for juice at "
        f"${rng.randint(30, 80) / 100:.2f} per kg; the rest sold at the market for ${rng.randint(150, 400) / 100:.2f} "
        f"per kg. Fuel and market fees came to ${rng.randint(120, 600)}, and {name} paid two helpers "
        f"${rng.randint(12, 20)} an hour for {rng.randint(20, 60)} hours each. (a) What was the revenue? "
        "(b) What was the profit? (c) What price per kg for the good apples would have doubled the profit?"
    )


# ------------------------------------------------------------------------------- long documents


def reference_chunks(rng: Random) -> list[tuple[str, str]]:
    """(title, text) chunks of the language reference, mostly 3,000-12,000 characters."""
    from pydoc_data.topics import topics

    chunks, pending, pending_titles = [], "", []
    for key in sorted(topics):
        text = topics[key].strip()
        title = text.split("\n", 1)[0]
        if len(text) < 3000:
            pending = (pending + "\n\n\n" + text).strip()
            pending_titles.append(title)
            if len(pending) >= 3000:
                chunks.append((" / ".join(pending_titles), pending))
                pending, pending_titles = "", []
            continue
        target, current, part = rng.randint(3000, 12000), [], 1
        for para in text.split("\n\n"):
            current.append(para)
            if sum(len(p) + 2 for p in current) >= target:
                chunks.append((f"{title} (part {part})", "\n\n".join(current)))
                target, current, part = rng.randint(3000, 12000), [], part + 1
        if current and sum(len(p) for p in current) < 1500 and part > 1:
            last_title, last_text = chunks.pop()  # a short remainder joins the part before it
            chunks.append((last_title, last_text + "\n\n" + "\n\n".join(current)))
        elif current:
            chunks.append((f"{title} (part {part})", "\n\n".join(current)))
    return chunks


DOC_QUESTIONS = [
    "what are the main rules it describes?",
    "list every keyword or builtin it mentions.",
    "what would surprise a programmer coming from Java?",
    "which parts changed in recent versions?",
    "what are the common mistakes this section warns about?",
]


def doc_prompt(rng: Random, title: str, doc: str) -> str:
    """An instruction (summarise, ask, outline, quiz, translate, ...) around a section of the Python reference."""
    kind = rng.randrange(7)
    if kind == 0:
        return f"Summarize the following documentation in {rng.randint(3, 8)} bullet points.\n\n{doc}"
    if kind == 1:
        return f"{doc}\n\nBased only on the text above, {rng.choice(DOC_QUESTIONS)}"
    if kind == 2:
        return (
            "I'm preparing a workshop. Turn this section of the Python reference ("
            + title
            + ") into a beginner-friendly tutorial outline with exercises.\n\n"
            + doc
        )
    if kind == 3:
        return f"Write {rng.randint(3, 10)} quiz questions with answers based on this text:\n\n{doc}"
    if kind == 4:
        return f"Extract all code examples from this text and explain each one briefly.\n\n---\n{doc}\n---"
    if kind == 5:
        return f"{doc}\n\nTL;DR?"
    return f"Translate the following into {rng.choice(LANGS)}, keeping code and grammar rules unchanged:\n\n{doc}"


def incident_log(rng: Random) -> str:
    """A generated service log with an incident in it, and a request to find its root cause."""
    lines, start = [], rng.randint(0, 40)
    incident_at = rng.randint(25, 60)
    services = ["api", "checkout", "auth", "search", "worker"]
    for i in range(rng.randint(70, 140)):
        minute, second = start + i // 4, rng.randint(0, 59)
        svc = rng.choice(services)
        bad = i >= incident_at and svc in ("checkout", "api") and rng.random() < 0.6
        status = rng.choice([500, 502, 503, 504]) if bad else rng.choice([200, 200, 200, 201, 204, 304, 404])
        latency = rng.randint(900, 30000) if bad else rng.randint(4, 250)
        level = "ERROR" if status >= 500 else "INFO"
        path = rng.choice(
            ["/v1/orders", "/v1/cart", "/v1/login", "/v1/search?q=shoes", "/v1/payments", "/healthz"]
        )
        extra = ' upstream=payments-db err="connection pool exhausted"' if bad and rng.random() < 0.5 else ""
        lines.append(
            f"2024-03-14T10:{minute % 60:02d}:{second:02d}Z {level} {svc} req={rng.getrandbits(32):08x} "
            f"path={path} status={status} latency_ms={latency}{extra}"
        )
    return (
        "Here's an excerpt from our production logs during last night's incident window. What went wrong, "
        "when did it start, and which service was the root cause?\n\n```\n" + "\n".join(lines) + "\n```"
    )


def sales_csv(rng: Random) -> str:
    """A generated CSV export of sales, and a request to analyse it."""
    rows = ["date,region,product,units,revenue_eur"]
    for _ in range(rng.randint(90, 220)):
        units = rng.randint(1, 400)
        rows.append(
            f"2023-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},"
            f"{rng.choice(['north', 'south', 'east', 'west', 'online'])},"
            f"{rng.choice(['basic', 'plus', 'pro', 'enterprise'])},{units},{units * rng.randint(9, 120)}"
        )
    return (
        "Analyze this sales export. Which region and product grew fastest over the year, and is there "
        "anything that looks like a data error?\n\n" + "\n".join(rows)
    )


TRANSCRIPT_LINES = [
    "I think we should ship the {t} as is and fix the rest in the next sprint.",
    "I'm not comfortable with that, the {t} still fails in two of the regional setups.",
    "Can we get numbers on how many customers actually use the {t}?",
    "Last time we rushed the {t} we spent a month on support tickets.",
    "Marketing already announced a date, so moving it is going to be painful.",
    "OK, let's timebox it: two more days on the {t}, then we decide.",
    "Who owns the rollback plan if the {t} goes wrong?",
    "I can take that, but I'll need someone from infra on call that weekend.",
    "Let's also write down what 'done' means for the {t}, we keep arguing about it.",
]


def transcript(rng: Random) -> str:
    """A generated meeting transcript, and a request to summarise it."""
    people = rng.sample(NAMES, rng.randint(3, 6))
    lines = []
    for _ in range(rng.randint(35, 80)):
        t = rng.choice(MEETING_TOPICS)
        lines.append(f"{rng.choice(people)}: {rng.choice(TRANSCRIPT_LINES).format(t=t)}")
    return (
        "Below is an auto-generated transcript of our planning call. Summarize it, list the decisions, the "
        "open questions, and who agreed to do what.\n\n" + "\n".join(lines)
    )


# ---------------------------------------------------------------------------------------- tools


def tool(name: str, description: str, props: dict, required: list[str]) -> dict:
    """An OpenAI-style function tool schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


STR, INT = {"type": "string"}, {"type": "integer"}
TOOLS = {
    "get_weather": tool(
        "get_weather",
        "Current weather and forecast for a location.",
        {
            "location": {**STR, "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {**INT, "description": "Forecast days, 0 for current only"},
        },
        ["location"],
    ),
    "search_flights": tool(
        "search_flights",
        "Search for flights between two airports or cities.",
        {
            "origin": STR,
            "destination": STR,
            "date": {**STR, "description": "YYYY-MM-DD"},
            "passengers": INT,
            "cabin": {"type": "string", "enum": ["economy", "premium", "business"]},
        },
        ["origin", "destination", "date"],
    ),
    "create_event": tool(
        "create_event",
        "Create a calendar event for the current user.",
        {
            "title": STR,
            "start": {**STR, "description": "ISO 8601 datetime"},
            "duration_minutes": INT,
            "attendees": {"type": "array", "items": STR},
        },
        ["title", "start"],
    ),
    "send_email": tool(
        "send_email",
        "Send an email on behalf of the user.",
        {"to": {"type": "array", "items": STR}, "subject": STR, "body": STR},
        ["to", "subject", "body"],
    ),
    "convert_currency": tool(
        "convert_currency",
        "Convert an amount between currencies at today's rate.",
        {"amount": {"type": "number"}, "from": STR, "to": STR},
        ["amount", "from", "to"],
    ),
    "get_stock_price": tool(
        "get_stock_price", "Latest price for a stock ticker.", {"ticker": STR}, ["ticker"]
    ),
    "search_products": tool(
        "search_products",
        "Search the store catalogue.",
        {
            "query": STR,
            "max_price": {"type": "number"},
            "category": STR,
            "sort": {"type": "string", "enum": ["relevance", "price_asc", "price_desc", "rating"]},
        },
        ["query"],
    ),
    "get_order_status": tool(
        "get_order_status", "Look up the status of an order by its number.", {"order_id": STR}, ["order_id"]
    ),
    "book_table": tool(
        "book_table",
        "Book a restaurant table.",
        {"restaurant": STR, "time": STR, "party_size": INT, "notes": STR},
        ["restaurant", "time", "party_size"],
    ),
    "run_sql": tool(
        "run_sql",
        "Run a read-only SQL query against the analytics warehouse.",
        {"query": STR, "limit": INT},
        ["query"],
    ),
    "create_ticket": tool(
        "create_ticket",
        "Open an issue in the team's tracker.",
        {
            "title": STR,
            "description": STR,
            "priority": {"type": "string", "enum": ["low", "medium", "high"]},
            "assignee": STR,
        },
        ["title"],
    ),
    "set_reminder": tool("set_reminder", "Set a reminder.", {"text": STR, "when": STR}, ["text", "when"]),
    "web_search": tool(
        "web_search",
        "Search the web and return the top results.",
        {"query": STR, "num_results": INT},
        ["query"],
    ),
    "get_time": tool("get_time", "Current time in a timezone.", {"tz": STR}, ["tz"]),
}


def tool_request(rng: Random, name: str) -> tuple[str, dict]:
    """A user request for ``name`` and the arguments a correct call would carry."""
    city, other = rng.sample(CITIES, 2)
    month, day = rng.randint(1, 12), rng.randint(1, 28)
    if name == "get_weather":
        return rng.choice(
            [
                f"what's the weather in {city} right now?",
                f"Will it rain in {city} this weekend?",
                f"Give me a {rng.randint(2, 7)} day forecast for {city} in fahrenheit",
            ]
        ), {"location": city}
    if name == "search_flights":
        n = rng.randint(1, 4)
        return (
            f"Find me {rng.choice(['cheap', 'direct', 'morning'])} flights from {city} to {other} on "
            f"2025-{month:02d}-{day:02d} for {n} {'person' if n == 1 else 'people'}"
        ), {"origin": city, "destination": other}
    if name == "create_event":
        who = rng.sample(NAMES, 2)
        return (
            f"Put a {rng.choice([30, 45, 60])} minute meeting with {who[0]} and {who[1]} on my calendar for "
            f"next {rng.choice(['Monday', 'Tuesday', 'Thursday'])} at {rng.randint(9, 16)}:00 about "
            f"{rng.choice(PROJECTS)}"
        ), {"title": "meeting"}
    if name == "send_email":
        who = rng.choice(NAMES)
        return (
            f"Email {who.lower()}@example.com and tell them I'll be {rng.randint(5, 30)} minutes late to "
            f"the {rng.choice(['standup', 'dentist', 'interview', 'review'])}"
        ), {"to": [f"{who.lower()}@example.com"]}
    if name == "convert_currency":
        return (
            f"how much is {rng.randint(5, 5000)} {rng.choice(['USD', 'GBP', 'JPY'])} in {rng.choice(['EUR', 'CHF', 'BRL'])}?",
            {},
        )
    if name == "get_stock_price":
        t = rng.choice(["AAPL", "MSFT", "NVDA", "ASML", "TSM", "SAP"])
        return f"What's {t} trading at?", {"ticker": t}
    if name == "search_products":
        return (
            f"I need {rng.choice(['running shoes', 'a standing desk', 'noise cancelling headphones', 'a rice cooker'])} "
            f"under ${rng.randint(5, 40) * 10}, best rated first"
        ), {}
    if name == "get_order_status":
        oid = f"{rng.choice('ABCDEFGH')}{rng.randint(100000, 999999)}"
        return (
            f"Where is my order {oid}? It was supposed to arrive {rng.choice(['yesterday', 'on Monday', 'last week'])}.",
            {"order_id": oid},
        )
    if name == "book_table":
        return (
            f"Book a table for {rng.randint(2, 8)} at {rng.choice(['Osteria Nova', 'The Green Room', 'Sakura', 'Casa Lima'])} "
            f"tonight at {rng.randint(6, 9)}:{rng.choice(['00', '30'])}pm, {rng.choice(['window seat if possible', 'one high chair', 'its a birthday'])}"
        ), {}
    if name == "run_sql":
        return (
            f"How many orders did we get from {rng.choice(['Germany', 'Brazil', 'Japan'])} last month compared to the month before?",
            {},
        )
    if name == "create_ticket":
        return (
            f"Open a {rng.choice(['high', 'medium'])} priority ticket: {rng.choice(['login page times out on Safari', 'CSV export drops the last row', 'dark mode breaks the chart colours'])}, "
            f"assign it to {rng.choice(NAMES)}"
        ), {}
    if name == "set_reminder":
        return (
            f"remind me to {rng.choice(['call mum', 'renew my passport', 'water the plants', 'submit the expense report'])} {rng.choice(['tomorrow at 9', 'in 2 hours', 'on Friday'])}",
            {},
        )
    if name == "web_search":
        return (
            f"search the web for {rng.choice(['the latest Python release notes', 'reviews of the Framework laptop', 'how to repot an orchid'])}",
            {},
        )
    return f"what time is it in {city}", {"tz": city}


def tool_prompt(rng: Random) -> str:
    """A tool-calling request: tool schemas (compact or full) and a user request one of them serves."""
    names = list(TOOLS)
    kind = rng.randrange(10)
    if kind == 0:  # tiny: one tool, compact, as many clients send it
        target = rng.choice(["get_time", "get_stock_price", "get_order_status"])
        request, _ = tool_request(rng, target)
        schema = TOOLS[target]["function"]
        short = {"name": schema["name"], "parameters": schema["parameters"]}
        return json.dumps(
            {"tools": [short], "messages": [{"role": "user", "content": request}]}, separators=(",", ":")
        )
    chosen = rng.sample(names, rng.randint(1, 7))
    target = rng.choice(chosen)
    request, args = tool_request(rng, target)
    messages = [
        {
            "role": "system",
            "content": rng.choice(
                [
                    "You are a helpful assistant. Use the tools when they help; ask before doing anything irreversible.",
                    "You are the support assistant for an online store. Call tools to look things up, never guess.",
                    "Answer concisely. Today is 2025-03-14.",
                ]
            ),
        },
        {"role": "user", "content": request},
    ]
    if kind >= 7:  # a follow-up turn after one tool round-trip
        call_id = f"call_{rng.getrandbits(40):010x}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": target, "arguments": json.dumps(args)},
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "content": json.dumps(
                    {
                        "ok": True,
                        "result": rng.choice(["found 3 matches", "done", {"value": rng.randint(1, 999)}]),
                    }
                ),
            }
        )
        messages.append({"role": "assistant", "content": "Done. Anything else?"})
        follow, _ = tool_request(rng, rng.choice(chosen))
        messages.append({"role": "user", "content": "thanks. also: " + follow})
    tools = [TOOLS[n] for n in chosen]
    if kind in (1, 2):
        return (
            "You have access to the following functions. To call one, reply with a JSON object "
            '{"name": ..., "arguments": {...}}.\n\n' + json.dumps(tools, indent=2) + "\n\nUser: " + request
        )
    indent = 2 if kind in (3, 4, 7) else None
    return json.dumps({"tools": tools, "messages": messages}, indent=indent)


# ---------------------------------------------------------------------------------------- main


def generate() -> list[dict[str, str]]:
    """Every record of the log, class by class, in a fixed order from one seeded RNG."""
    rng = Random(SEED)
    chunks = reference_chunks(rng)
    docs = [text for _, text in chunks]
    functions = stdlib_functions()
    by_class: dict[str, list[str]] = {}

    by_class["chat"] = (
        [chat_short(rng) for _ in range(65)]
        + [chat_medium(rng) for _ in range(55)]
        + [chat_long(rng, docs) for _ in range(30)]
    )

    long_fns = [f for f in functions if len(f[1]) > 1900]
    picked = rng.sample(long_fns, 30) + rng.sample([f for f in functions if len(f[1]) <= 1900], 40)
    by_class["code"] = (
        [code_short(rng) for _ in range(18)]
        + [code_sql(rng) for _ in range(12)]
        + [code_with_source(rng, qual, src) for qual, src in picked]
    )

    by_class["math"] = (
        [math_problem(rng) for _ in range(58)]
        + [math_story(rng) for _ in range(12)]
        + [math_problem_set(rng) for _ in range(10)]
    )

    long_docs = [doc_prompt(rng, title, text) for title, text in rng.sample(chunks, min(len(chunks), 58))]
    long_docs += [incident_log(rng) for _ in range(8)] + [sales_csv(rng) for _ in range(7)]
    long_docs += [transcript(rng) for _ in range(COUNTS["long_document"] - len(long_docs))]
    by_class["long_document"] = long_docs

    by_class["tool_call"] = [tool_prompt(rng) for _ in range(COUNTS["tool_call"])]

    records = []
    for cls, texts in by_class.items():
        if len(texts) != COUNTS[cls]:
            raise SystemExit(f"internal: {cls} has {len(texts)} records, expected {COUNTS[cls]}")
        records += [{"id": f"{cls}-{i:04d}", "class": cls, "text": t} for i, t in enumerate(texts)]
    rng.shuffle(records)  # arrival order, as a log would have it
    return records


def write(path: Path) -> None:
    """Write the log to ``path`` as UTF-8 JSONL with ``\n`` line ends."""
    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in generate()]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.writelines(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: write the log, noting when this Python differs from the one that made the committed file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT.name})")
    args = parser.parse_args(argv)
    if ".".join(map(str, sys.version_info[:3])) != GENERATED_WITH:
        print(
            f"note: the committed log was generated with Python {GENERATED_WITH}; this is "
            f"{sys.version.split()[0]}, so stdlib-derived records may differ",
            file=sys.stderr,
        )
    write(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
