"""docsection.py: replace one generated section of a Markdown page, shared by bench/'s reports."""
import os


def replace_section(path, section, begin, end, after=None):
    """Put section (which starts with begin and ends with end) in place of the text between
    those markers in path, or, when new, after the line holding the last occurrence of after
    (a marker's prefix) if given and present, else at the end; atomically, so an interrupted
    run leaves the old page."""
    with open(path) as f:
        text = f.read()
    if begin in text and end in text:
        pre, rest = text.split(begin, 1)
        text = pre + section.rstrip("\n") + rest.split(end, 1)[1]
    elif after is not None and after in text:
        cut = text.index("\n", text.rindex(after)) + 1 if "\n" in text[text.rindex(after):] else len(text)
        text = text[:cut] + "\n" + section.rstrip("\n") + "\n" + text[cut:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
