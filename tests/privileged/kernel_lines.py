"""Writing test lines into the host's real kernel log, and waiting for them to arrive.

Every line a test writes carries MARK, so that nobody reading the host's log takes it for
a GPU error."""

import time

from gpuwhy.probes.klog.lines import TEST_LINE_MARK

MARK = TEST_LINE_MARK      # gpuwhy ignores marked lines unless klog.test_lines is on

LINES_PER_OPEN = 8      # /dev/kmsg rate-limits writers to 10 lines per open (printk_devkmsg)


def write_kmsg(lines):
    """Each line into the kernel's ring buffer, as root."""
    for start in range(0, len(lines), LINES_PER_OPEN):
        with open("/dev/kmsg", "w") as kmsg:
            for line in lines[start:start + LINES_PER_OPEN]:
                kmsg.write(line + "\n")
                kmsg.flush()


def wait_for(predicate, timeout, what):
    """``predicate()``'s first true value within ``timeout`` s, else an AssertionError."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value
