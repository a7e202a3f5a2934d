"""GourmetGram under gunicorn, a production WSGI server: its image runs `gunicorn app:app`, which
reads this file. (`make up` and the tests run Flask's own server, `python app.py`: one process.)

Gunicorn starts a master process that forks worker processes; each worker imports app.py and
builds its own app: its own connection to the model server and its own weights banner cache (each
asks the backend at most every WEIGHTS_CACHE_S seconds).
"""

import os
import shutil
import tempfile

bind = f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '5000')}"

# Two worker processes of four threads each. A request's own work here is a few milliseconds of
# decoding and resizing the photo; the rest is waiting on the model server, which threads cover
# (the page is no faster than that server, whatever this page's processes). The second process
# keeps the page answering while one is busy in Python code (a process runs one thread at a time)
# or is being replaced after a crash. Gunicorn's rule of thumb, twice the cores plus one, is for
# processes that each serve one request at a time: 97 on the node's 48 threads, each with its
# own memory, for a page one student uses.
workers = 2
worker_class = "gthread"
threads = 4

# A line per request, as Flask's server prints: `docker compose logs gourmetgram` shows them.
accesslog = "-"


def on_starting(server):
    """Before the workers start: /metrics adds up every worker's counts, through prometheus_client's
    multiprocess mode, in which each worker writes its metrics to files in one folder (app.py reads
    them all). The folder is PROMETHEUS_MULTIPROC_DIR where set, else a new one, and starts empty:
    counts from before a restart are not this server's."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="gourmetgram-metrics-")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder  # the workers, forked after this, inherit it
