"""Per-entry upload state shared by the request_command and the hooks of the example.

One JSON file per outbox entry id in S3_STATE_DIR (default `.s3-uploads` in the project
root, where outbox runs plugins and hooks). Written with a temp file, fsync and rename, so
a crash never leaves half a file.
"""

import json
import os


def folder():
    return os.environ.get("S3_STATE_DIR", ".s3-uploads")


def _path(entry_id):
    # outbox ids are [A-Za-z0-9._:@-] and never start with "." or "-": safe as file names.
    return os.path.join(folder(), f"{entry_id}.json")


def load(entry_id):
    try:
        with open(_path(entry_id), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def save(entry_id, data):
    os.makedirs(folder(), mode=0o700, exist_ok=True)
    final = _path(entry_id)
    temp = f"{final}.tmp-{os.getpid()}"
    with open(temp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, final)
    directory = os.open(folder(), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def remove(entry_id):
    try:
        os.unlink(_path(entry_id))
    except FileNotFoundError:
        pass


def target(variables, environ=None):
    """(path, bucket, key) of an entry's vars, the same way for the plugin and the hooks.

    `path` is made absolute against the enqueue's folder ($PWD), as outbox does; `key` is
    `vars.key`, or `vars.prefix` + (`vars.relative_path` or the file's name).
    """
    environ = os.environ if environ is None else environ
    path = variables.get("path")
    if not isinstance(path, str) or not path:
        raise ValueError("vars.path must name the file to upload")
    path = os.path.join(environ.get("PWD", os.getcwd()), path)
    bucket = variables.get("bucket") or environ.get("S3_BUCKET")
    if not bucket:
        raise ValueError("give vars.bucket or set S3_BUCKET")
    key = variables.get("key") or (variables.get("prefix", "") + (variables.get("relative_path") or os.path.basename(path)))
    return path, bucket, key
