# tools/word_count.py: called as word_count.py --path=notes/a.md
import argparse
import pathlib

parser = argparse.ArgumentParser()
parser.add_argument("--path", required=True)
print(len(pathlib.Path(parser.parse_args().path).read_text().split()))
