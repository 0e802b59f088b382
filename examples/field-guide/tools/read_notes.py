# tools/read_notes.py: prints every note of the turn's workspace ($HOME/notes/*.md).
# The weather plugin's save_note writes them there; declared tools of the same
# turn see the same folder as $HOME.
import json
import os
import pathlib

notes = pathlib.Path(os.environ["HOME"]) / "notes"
found = sorted(notes.glob("*.md"), key=lambda p: p.stat().st_mtime, reverse=True)
print(json.dumps([{"path": f"notes/{p.name}", "text": p.read_text()} for p in found], indent=2))
