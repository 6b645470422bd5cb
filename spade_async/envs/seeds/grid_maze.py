"""Multi-turn grid navigation: walk from @ to G through a walled maze drawn as text."""

import collections
import random
import re

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
WORDS = {"UP": "U", "DOWN": "D", "LEFT": "L", "RIGHT": "R", "NORTH": "U", "SOUTH": "D",
         "WEST": "L", "EAST": "R", "N": "U", "S": "D", "W": "L", "E": "R"}


def _resolve(specs, given):
    """The knob values of one episode: the given ones, the defaults for the rest, in range."""
    given = given if isinstance(given, dict) else {}
    out = {}
    for key, spec in specs.items():
        value = given.get(key, spec["default"])
        if spec["type"] == "int":
            value = min(spec["max"], max(spec["min"], int(value)))
        elif spec["type"] == "float":
            value = min(spec["max"], max(spec["min"], float(value)))
        elif spec["type"] == "bool":
            value = bool(value)
        elif value not in spec["choices"]:
            value = spec["default"]
        out[key] = value
    return out


def _parse(text):
    tokens = [t for t in re.split(r"[\s,;]+", text.strip().upper()) if t]
    if not tokens or len(tokens) > 40:
        return None
    moves = []
    for t in tokens:
        if t in WORDS:
            moves.append(WORDS[t])
        elif all(c in MOVES for c in t):
            moves.extend(t)
        else:
            return None
    return moves if len(moves) <= 40 else None


def _bfs(grid, start, goal):
    prev = {start: None}
    queue = collections.deque([start])
    while queue:
        cur = queue.popleft()
        if cur == goal:
            break
        for m in "UDLR":
            dr, dc = MOVES[m]
            nxt = (cur[0] + dr, cur[1] + dc)
            if grid[nxt[0]][nxt[1]] != "#" and nxt not in prev:
                prev[nxt] = (cur, m)
                queue.append(nxt)
    if goal not in prev:
        return None
    path, cur = [], goal
    while prev[cur] is not None:
        cur, m = prev[cur]
        path.append(m)
    return path[::-1]


class Environment:
    name = "grid_maze"
    description = (
        "Navigate a maze over several turns. The map shows walls '#', open floor '.', your "
        "position '@' and the goal 'G'; row 1 is the top. Each turn reply with one or more moves "
        "separated by spaces, each move being U, D, L or R (or up/down/left/right), e.g. 'R R D' "
        "or 'RRD'; a reply containing anything else is rejected. A move into a wall stops that "
        "reply's remaining moves. Reaching G wins. The task says how many replies you have (at "
        "most 12)."
    )
    max_turns = 12
    tools = []

    params = {
        "height": {"type": "int", "min": 3, "max": 9, "default": 7,
                   "description": "map rows, border walls included"},
        "width": {"type": "int", "min": 4, "max": 11, "default": 9,
                  "description": "map columns, border walls included"},
        "walls": {"type": "float", "min": 0.0, "max": 0.4, "default": 0.3,
                  "description": "share of inner cells that are walls"},
        "min_path": {"type": "int", "min": 1, "max": 12, "default": 7,
                     "description": "shortest path at least this long (as far as the map "
                                    "allows)"},
        "replies": {"type": "int", "min": 1, "max": 12, "default": 12, "easy": 12,
                    "description": "replies allowed"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        h, w = knobs["height"], knobs["width"]
        inner = (h - 2) * (w - 2)
        need_free = min(12, max(2, inner // 3 + 1))
        tries = 0
        while True:
            tries += 1
            # a map too small or too walled for the asked path gets easier asks, never a hang
            density = knobs["walls"] if tries <= 300 else 0.0
            need_path = knobs["min_path"] if tries <= 200 else 1
            grid = [["#"] * w for _ in range(h)]
            for r in range(1, h - 1):
                for c in range(1, w - 1):
                    grid[r][c] = "#" if rng.random() < density else "."
            free = [(r, c) for r in range(h) for c in range(w) if grid[r][c] == "."]
            if len(free) < need_free:
                continue
            start, goal = rng.sample(free, 2)
            path = _bfs(grid, start, goal)
            if path is not None and len(path) >= need_path:
                break
        self._h, self._w, self._budget = h, w, knobs["replies"]
        self._grid, self._pos, self._goal, self._path = grid, start, goal, path
        self._start = start
        self._turns = 0
        self._done = False
        told = "" if self._budget == self.max_turns else f" You have {self._budget} replies."
        return self._render("Reach G." + told), {
            "height": h, "width": w, "shortest_path": len(path), "knobs": knobs}

    def _render(self, msg):
        rows = []
        for r in range(self._h):
            row = ""
            for c in range(self._w):
                if (r, c) == self._pos:
                    row += "@"
                elif (r, c) == self._goal:
                    row += "G"
                else:
                    row += self._grid[r][c]
            rows.append(row)
        return msg + "\n" + "\n".join(rows)

    def step(self, action):
        if self._done:
            return "episode is over", 0.0, True, False, {}
        self._turns += 1
        try:
            obs, reward, term, info = self._act(str(action))
        except Exception as exc:  # step must never raise
            obs, reward, term, info = "internal error: " + str(exc)[:200], 0.0, False, {}
        trunc = (not term) and self._turns >= self._budget
        self._done = term or trunc
        if trunc:
            obs += "\nOut of replies; the episode is over."
        return obs, float(reward), term, trunc, info

    def _act(self, action):
        moves = _parse(action)
        if moves is None:
            return self._render("Rejected: reply with moves U, D, L, R only (at most 40)."), \
                0.0, False, {"moved": 0}
        done = 0
        note = ""
        for m in moves:
            dr, dc = MOVES[m]
            nxt = (self._pos[0] + dr, self._pos[1] + dc)
            if self._grid[nxt[0]][nxt[1]] == "#":
                note = f" Bumped into a wall on move {done + 1} ({m}); the rest were skipped."
                break
            self._pos = nxt
            done += 1
            if self._pos == self._goal:
                return self._render(f"You reached the goal in this reply after {done} moves!"), \
                    1.0, True, {"moved": done}
        return self._render(f"Made {done} of {len(moves)} moves.{note}"), 0.0, False, {
            "moved": done, "position": [self._pos[0] + 1, self._pos[1] + 1]}

    def hint(self):
        # A cell on the way, not moves: repeating a told move sequence could walk a
        # straight or self-similar path to G.
        n = len(self._path)
        if n < 3:
            return f"A shortest path has {n} move{'s' if n > 1 else ''}; no wall is in the way."
        r, c = self._start
        for m in self._path[: n // 2]:
            r, c = r + MOVES[m][0], c + MOVES[m][1]
        return (f"A shortest path has {n} moves; halfway it passes the cell in row {r + 1}, "
                f"column {c + 1} (row 1 is the top, column 1 the left).")

    def solution(self):
        path = _bfs(self._grid, self._pos, self._goal) or []
        size = max(1, -(-len(path) // min(10, self._budget)))
        return [" ".join(path[i:i + size]) for i in range(0, len(path), size)]
