#!/usr/bin/python3
"""Capsule's Python interpreter driver: one IPython kernel, driven over NDJSON.

Runs inside the sandbox, started by the host through the agent:

    python3 /.capsule/python_driver.py --context ID [--cwd DIR]

It starts an ipykernel (jupyter_client KernelManager, TCP on the sandbox's own loopback) and
speaks one JSON object per line:

  stdin  (host -> driver): {"id", "op": "execute", "code", "envVars"?}, {"op": "interrupt", "id"?},
                           {"op": "restart"}, {"op": "shutdown"}
  stdout (driver -> host): {"type": "ready"}, {"type": "restarted"}, {"type": "fatal", "message"},
                           and per execution (with its "id"): stdout, stderr, result, error,
                           executionCount, died, end.

Only this process writes to the protocol fd: the original stdout is duplicated for the protocol
and fd 1 is pointed at stderr, so a stray write (a C extension, a subprocess) cannot corrupt it.
"""
import json
import os
import shutil
import signal
import sys
import time

import zmq

MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/json": "json",
    "text/latex": "latex",
    "application/javascript": "javascript",
}
POLL_MS = 100
READY_TIMEOUT_S = 60

PROTO_FD = os.dup(1)
os.dup2(2, 1)
sys.stdout = sys.stderr


def emit(event):
    try:
        text = json.dumps(event, default=str, allow_nan=False)
    except ValueError:
        # NaN/Infinity in an application/json bundle is not JSON; the text form still describes it.
        event = {key: value for key, value in event.items() if key != "json"}
        text = json.dumps(event, default=str)
    data = (text + "\n").encode("utf-8")
    view = memoryview(data)
    while view:
        written = os.write(PROTO_FD, view)
        view = view[written:]


def parse_args(argv):
    args = {"context": "default", "cwd": os.getcwd()}
    i = 0
    while i < len(argv):
        key = argv[i]
        if key in ("--context", "--cwd") and i + 1 < len(argv):
            args[key[2:]] = argv[i + 1]
            i += 2
        else:
            raise SystemExit(f"python_driver: unknown argument {key}")
    return args


def prepare_environment(context):
    # Jupyter and IPython keep state under $HOME by default; keep it out of /workspace.
    base = f"/tmp/.capsule-py-{context}"
    os.makedirs(base, exist_ok=True)
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", f"{base}/runtime")
    os.environ.setdefault("JUPYTER_CONFIG_DIR", f"{base}/config")
    os.environ.setdefault("JUPYTER_DATA_DIR", f"{base}/data")
    os.environ.setdefault("IPYTHONDIR", f"{base}/ipython")
    os.environ.setdefault("MPLCONFIGDIR", "/tmp/.capsule-matplotlib")
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return base


def die_with_parent():
    # The kernel runs in its own session (jupyter_client's choice, for interrupts); if this
    # driver is killed, the kernel must not live on as an orphan in the sandbox.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort; the sandbox's own teardown kills it anyway
        pass
    # Interrupts are SIGINT to the kernel: it must start with the default disposition.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Driver:
    def __init__(self, context, cwd, base):
        from jupyter_client import KernelManager

        self.context = context
        self.cwd = cwd
        self.km = KernelManager(
            kernel_name="python3",
            connection_file=f"{base}/kernel.json",
            transport="tcp",
            ip="127.0.0.1",
        )
        self.session = self.km.session
        self.shell = None
        self.iopub = None
        self.inbox = b""
        self.requests = []
        self.stdin_open = True

    # --- kernel lifecycle -------------------------------------------------------------------
    def start(self):
        self.km.start_kernel(
            cwd=self.cwd,
            preexec_fn=die_with_parent,
            extra_arguments=[
                "--HistoryManager.enabled=False",
                "--IPKernelApp.quiet=True",
                "--InteractiveShell.colors=NoColor",
            ],
        )
        self.connect()

    def connect(self):
        # Plain (synchronous) zmq sockets: one poll covers stdin and the kernel's iopub.
        self.shell = self.km.connect_shell()
        self.iopub = self.km.connect_iopub()
        self.wait_for_ready()

    def disconnect(self):
        for sock in (self.shell, self.iopub):
            if sock is not None:
                sock.close(linger=0)
        self.shell = self.iopub = None

    def wait_for_ready(self):
        """Asks kernel_info until the shell answers and iopub is subscribed (it drops early messages)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        shell_ok = iopub_ok = False
        while not (shell_ok and iopub_ok):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the kernel did not answer within {READY_TIMEOUT_S} s")
            if not self.km.is_alive():
                raise RuntimeError("the kernel exited during start-up")
            if not shell_ok:
                self.session.send(self.shell, "kernel_info_request", {})
            if self.shell.poll(200):
                self.session.recv(self.shell, mode=zmq.NOBLOCK)
                shell_ok = True
            while self.iopub.poll(50 if shell_ok else 0):
                self.session.recv(self.iopub, mode=zmq.NOBLOCK)
                iopub_ok = True
                if shell_ok:
                    break
            if shell_ok and not iopub_ok:
                self.session.send(self.shell, "kernel_info_request", {})
                if self.shell.poll(1000):
                    self.session.recv(self.shell, mode=zmq.NOBLOCK)
        self.drain(self.iopub)

    def restart(self):
        self.disconnect()
        self.km.restart_kernel(now=True, newports=False)
        self.connect()

    def shutdown(self):
        try:
            self.disconnect()
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=True)
        except Exception as error:  # noqa: BLE001 - shutting down anyway
            print(f"python_driver: shutdown: {error}", file=sys.stderr)

    # --- host requests ----------------------------------------------------------------------
    def read_requests(self, timeout_ms):
        """Waits up to timeout_ms for stdin or iopub; queues complete request lines."""
        poller = zmq.Poller()
        poller.register(self.iopub, zmq.POLLIN)
        if self.stdin_open:
            poller.register(0, zmq.POLLIN)
        ready = dict(poller.poll(timeout_ms))
        if not (self.stdin_open and 0 in ready):
            return
        chunk = os.read(0, 65536)
        if not chunk:
            self.stdin_open = False
            self.requests.append({"op": "shutdown"})
        self.inbox += chunk
        while b"\n" in self.inbox:
            line, self.inbox = self.inbox.split(b"\n", 1)
            if line.strip():
                try:
                    self.requests.append(json.loads(line))
                except ValueError as error:
                    emit({"type": "fatal", "message": f"bad request line: {error}"})

    def take_control(self):
        """Removes and returns the first interrupt/restart/shutdown request, if any."""
        for index, request in enumerate(self.requests):
            if request.get("op") in ("interrupt", "restart", "shutdown"):
                return self.requests.pop(index)
        return None

    def serve(self):
        while True:
            if not self.requests:
                self.read_requests(None if self.stdin_open else 0)
                # Output of nobody's execution (a thread printing later) is dropped here.
                self.drain(self.iopub)
                self.drain(self.shell)
                continue
            request = self.requests.pop(0)
            op = request.get("op")
            if op == "execute":
                self.execute(request)
            elif op == "interrupt":
                pass  # nothing runs
            elif op == "restart":
                self.restart_and_report()
            elif op == "shutdown":
                return
            else:
                emit({"type": "fatal", "message": f"unknown op {op!r}"})

    def restart_and_report(self):
        try:
            self.restart()
            emit({"type": "restarted"})
        except Exception as error:  # noqa: BLE001 - reported to the host
            emit({"type": "fatal", "message": f"restarting the kernel failed: {error}"})

    def drain(self, sock):
        while sock is not None and sock.poll(0):
            self.session.recv(sock, mode=zmq.NOBLOCK)

    # --- one execution ----------------------------------------------------------------------
    def send_execute(self, code, silent):
        content = {
            "code": code,
            "silent": silent,
            "store_history": not silent,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        return self.session.send(self.shell, "execute_request", content)["header"]["msg_id"]

    def execute(self, request):
        rid = request.get("id")
        env = request.get("envVars") or {}
        if env:
            setup = (
                "import os as _o, sys as _s\n"
                f"_s._capsule_saved_env = {{k: _o.environ.get(k) for k in {list(env)!r}}}\n"
                f"_o.environ.update({env!r})\n"
                "del _o, _s"
            )
            outcome = self.wait_idle(self.send_execute(setup, True), None)
            if outcome != "idle":
                emit({"id": rid, "type": "end", "outcome": outcome})
                return
        outcome = self.wait_idle(self.send_execute(request.get("code", ""), False), rid)
        if env and outcome == "idle":
            restore = (
                "import os as _o, sys as _s\n"
                "for _k, _v in _s._capsule_saved_env.items():\n"
                "    _o.environ.pop(_k, None) if _v is None else _o.environ.__setitem__(_k, _v)\n"
                "del _s._capsule_saved_env, _o, _s, _k, _v"
            )
            self.wait_idle(self.send_execute(restore, True), None)
        emit({"id": rid, "type": "end", "outcome": outcome})

    def wait_idle(self, msg_id, rid):
        """Forwards iopub messages of msg_id until idle; returns idle, died, restarted or shutdown."""
        while True:
            while self.iopub.poll(0):
                _, msg = self.session.recv(self.iopub, mode=zmq.NOBLOCK)
                if msg is None or msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if self.forward(msg, rid):
                    self.drain(self.shell)
                    return "idle"
            control = self.take_control()
            if control is not None:
                op = control["op"]
                if op == "interrupt" and control.get("id") in (None, rid):
                    self.km.interrupt_kernel()
                elif op == "restart":
                    self.restart_and_report()
                    return "restarted"
                elif op == "shutdown":
                    self.requests.insert(0, control)
                    return "shutdown"
            if not self.km.is_alive():
                emit({"id": rid, "type": "died", "context": self.context})
                return "died"
            self.read_requests(POLL_MS)

    def forward(self, msg, rid):
        """Sends one iopub message as host events; True when the execution is over."""
        kind = msg["msg_type"]
        content = msg.get("content", {})
        if kind == "status":
            return content.get("execution_state") == "idle"
        if rid is None:
            return False
        if kind == "stream":
            name = "stderr" if content.get("name") == "stderr" else "stdout"
            emit({"id": rid, "type": name, "text": content.get("text", "")})
        elif kind in ("execute_result", "display_data"):
            result = bundle(content.get("data", {}))
            result["isMainResult"] = kind == "execute_result"
            emit({"id": rid, "type": "result", **result})
        elif kind == "error":
            emit({
                "id": rid,
                "type": "error",
                "name": content.get("ename", ""),
                "value": content.get("evalue", ""),
                "traceback": "\n".join(content.get("traceback", [])),
            })
        elif kind == "execute_input":
            emit({"id": rid, "type": "executionCount", "count": content.get("execution_count")})
        return False


def bundle(data):
    result = {}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        elif field == "json":
            result[field] = value
        else:
            result[field] = value if isinstance(value, str) else json.dumps(value)
    if extra:
        result["extra"] = extra
    return result


def exit_on_signal(_signum, _frame):
    raise SystemExit(0)  # runs main's finally: the kernel is shut down with the driver


def main():
    args = parse_args(sys.argv[1:])
    # The host interrupts the kernel, never this driver; a stray SIGINT must not end it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, exit_on_signal)
    base = prepare_environment(args["context"])
    try:
        os.chdir(args["cwd"])
    except OSError as error:
        emit({"type": "fatal", "message": f"cannot enter {args['cwd']}: {error.strerror}"})
        return 1
    try:
        driver = Driver(args["context"], args["cwd"], base)
        driver.start()
    except Exception as error:  # noqa: BLE001 - reported to the host
        emit({"type": "fatal", "message": f"starting the IPython kernel failed: {type(error).__name__}: {error}"})
        return 1
    emit({"type": "ready"})
    try:
        driver.serve()
    finally:
        driver.shutdown()
        shutil.rmtree(base, ignore_errors=True)  # /tmp is memory: leave nothing per context
    return 0


if __name__ == "__main__":
    sys.exit(main())
