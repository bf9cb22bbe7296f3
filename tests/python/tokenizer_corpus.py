"""A deterministic corpus of strings for the tokenizer parity tests (tests/python/test_tokenizer.py).

make_corpus() returns the same list every time (a fixed seed): hand-written edge cases, then random
mixes of fragments (CJK, emoji and ZWJ sequences, combining marks, RTL text, whitespace runs, digit runs,
special tokens and look-alikes, mixed scripts, long words), then random valid UTF-8.
"""

import random

SEED = 20261122

# Special tokens of both test models, written as text.
SPECIAL_TOKENS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "<jupyter_code>",
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
    "[multimodal]", "<unused0>", "<unused94>", "<table>", "<td>",
]
# Near misses that must stay plain text.
LOOK_ALIKES = [
    "<|im_start|", "|im_start|>", "<|im_start |>", "<|IM_START|>", "< |im_end|>", "<|im_end||>", "<<|im_end|>",
    "<start_of_turn", "start_of_turn>", "<start-of-turn>", "<Start_of_turn>", "<end_of_turn >", "<bos ", "<eos>>",
    "<0x41>", "<0xZZ>", "<unused>", "<|endoftext", "[multimodal", "<s>", "</s>", "<|", "|>", "<>",
]
CJK = ["你好，世界", "日本語のテキスト", "한국어 문장입니다", "漢字かなカナ", "中文标点：「引号」……",
       "𠀀𠀁𪚥", "ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇯🇵", "❤️", "🧑🏿‍💻", "☕️", "🤖🤖🤖", "1️⃣", "🫠"]
COMBINING = ["e\u0301", "n\u0303", "a\u0308\u0304", "Z\u0351\u0324\u0355", "\u0915\u094d\u0937",
             "ก\u0e34\u0e4a", "o\u0338", "\u1100\u1161\u11a8", "i\u0307"]
RTL = ["مرحبا بالعالم", "שלום עולם", "العربية 123 نص", "\u202eevil\u202c", "فارسی‌نویسی", "עִבְרִית"]
WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n ", "\u00a0", "\u3000", "\u2009",
              "\u200b", "\f", "\v", "    \n\t  ", "\n\n\n\n", " \t\r\n"]
DIGITS = ["0", "7", "42", "123", "1234", "12345", "3.14159", "1,000,000", "0x1F", "٣٤٥", "१२३", "½", "²³",
          "2026-11-22", "99999999999999999999"]
WORDS = ["hello", "Hello", "HELLO", "world", "don't", "I'm", "we'll", "they've", "it's", "she'd", "you're",
         "tokenization", "antidisestablishmentarianism", "Straße", "naïve", "café", "Ωμέγα", "Привет", "мир",
         "ελληνικά", "hello_world", "camelCaseWord", "snake_case_var", "C++", "foo.bar()", "x=y+1;", "#include",
         "https://example.com/a?b=c", "user@example.com", "'s", "'S", "O'Neil", "ﬁ", "Ǆ", "İstanbul"]
PUNCT = [".", ",", "!", "?", "...", "—", "–", "-", "(", ")", "[", "]", "{", "}", "\"", "'", "`", "~", "@", "#",
         "$", "%", "^", "&", "*", "_", "+", "=", "|", "\\", "/", ":", ";", "<", ">", "«", "»", "¿", "¡", "•"]
LONG = ["a" * 300, "ab" * 150, "x" * 1000, "😀" * 50, "abc def " * 40, " " * 200, "\n" * 64, "1" * 100,
        "Donaudampfschifffahrtsgesellschaftskapitänswitwe", "pneumonoultramicroscopicsilicovolcanoconiosis"]

HAND_WRITTEN = [
    "", " ", "  ", "a", " a", "a ", "  a  ", "\n", "\t", "\r", "\r\n", "Hello world", " Hello world",
    "Hello  world", "Hello\tworld", "Hello\nworld", "Hello\r\nworld", "hello   \n  world", "<|im_start|>user\nHi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n", "<start_of_turn>user\nHi<end_of_turn>\n",
    "<bos><start_of_turn>model\n", "text<|endoftext|>more", "<|im_start|><|im_end|>", "<eos><eos><bos>",
    "The year 2026 has 365 days.", "12 345 6789", "a1b2c3", "x²+y²=z²", "I'm sure they'll say it's fine.",
    "DON'T SHOUT", "«Bonjour», dit-il.", "¿Qué tal?", "Ça va très bien.", "ﾊﾝｶｸ", "\u2581leading metaspace",
    "tab\tseparated\tvalues", "trailing spaces   ", "   leading spaces", "mixed 中文 and English",
    "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "<html><body><table><tr><td>cell</td></tr></table></body></html>", "{\"key\": [1, 2, 3]}",
    "emoji 👨‍👩‍👧‍👦 family", "flags 🇺🇸🇬🇧", "skin 👋🏻👋🏿", "zwj\u200dalone", "zwnj\u200cword", "bom\ufeffword",
    "\u0000nul", "ctrl\u0001\u0007\u001b", "del\u007f", "\u0085next line", "line\u2028sep", "para\u2029sep",
    "replacement \ufffd char", "private \ue000\uf8ff", "astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "math 𝑥∈ℝ", "music 𝄞",
]


def random_fragment(rng: random.Random) -> str:
    pools = [SPECIAL_TOKENS, LOOK_ALIKES, CJK, EMOJI, COMBINING, RTL, WHITESPACE, DIGITS, WORDS, WORDS, WORDS,
             PUNCT, PUNCT]
    return rng.choice(rng.choice(pools))


def random_mix(rng: random.Random) -> str:
    n = rng.randint(1, 12)
    parts = []
    for _ in range(n):
        parts.append(random_fragment(rng))
        if rng.random() < 0.5:
            parts.append(rng.choice([" ", " ", " ", "", "\n", "  ", "\t"]))
    if rng.random() < 0.05:
        parts.append(rng.choice(LONG))
    return "".join(parts)


# Code point ranges to draw random valid UTF-8 from (no surrogates), weighted towards real text.
RANGES = [
    (0x20, 0x7E, 8), (0x09, 0x0D, 1), (0x00, 0x1F, 1), (0xA0, 0x24F, 3), (0x370, 0x3FF, 1), (0x400, 0x4FF, 2),
    (0x590, 0x6FF, 2), (0x900, 0x97F, 1), (0xE00, 0xE7F, 1), (0x1100, 0x11FF, 1), (0x2000, 0x206F, 2),
    (0x2190, 0x2BFF, 1), (0x3000, 0x30FF, 2), (0x4E00, 0x9FFF, 3), (0xAC00, 0xD7A3, 2), (0xE000, 0xF8FF, 1),
    (0xFE00, 0xFFFD, 1), (0x10000, 0x1FFFF, 2), (0x1F300, 0x1FAFF, 3), (0x20000, 0x2FFFF, 1), (0xE0000, 0xE007F, 1),
    (0xF0000, 0x10FFFF, 1),
]


def random_unicode(rng: random.Random) -> str:
    n = rng.choice([1, 2, 3, 5, 8, 13, 30, 80])
    weights = [w for _, _, w in RANGES]
    chars = []
    for _ in range(n):
        lo, hi, _ = rng.choices(RANGES, weights)[0]
        chars.append(chr(rng.randint(lo, hi)))
    return "".join(chars)


def make_corpus(n_mix: int = 1400, n_random: int = 700) -> list:
    rng = random.Random(SEED)
    corpus = list(HAND_WRITTEN)
    corpus += SPECIAL_TOKENS + LOOK_ALIKES + CJK + EMOJI + COMBINING + RTL + WHITESPACE + DIGITS + WORDS + LONG
    corpus += [random_mix(rng) for _ in range(n_mix)]
    corpus += [random_unicode(rng) for _ in range(n_random)]
    return corpus


if __name__ == "__main__":
    c = make_corpus()
    print(len(c), "strings,", sum(len(s.encode()) for s in c), "bytes")
