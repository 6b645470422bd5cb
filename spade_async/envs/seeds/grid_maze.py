"""Multi-turn grid navigation: walk from @ to G through a walled maze drawn as text."""

import collections
import random
import re

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
WORDS = {"UP": "U", "DOWN": "D", "LEFT": "L", "RIGHT": "R", "NORTH": "U", "SOUTH": "D",
         "WEST": "L", "EAST": "R", "N": "U", "S": "D", "W": "L", "E": "R"}
HEIGHT, WIDTH = 7, 9


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
        "reply's remaining moves. Reaching G wins. You have 12 replies."
    )
    max_turns = 12
    tools = []

    _done = True
    _turns = 0

    def reset(self, seed):
        rng = random.Random(seed)
        while True:
            grid = [["#"] * WIDTH for _ in range(HEIGHT)]
            for r in range(1, HEIGHT - 1):
                for c in range(1, WIDTH - 1):
                    grid[r][c] = "#" if rng.random() < 0.3 else "."
            free = [(r, c) for r in range(HEIGHT) for c in range(WIDTH) if grid[r][c] == "."]
            if len(free) < 12:
                continue
            start, goal = rng.sample(free, 2)
            path = _bfs(grid, start, goal)
            if path is not None and len(path) >= 7:
                break
        self._grid, self._pos, self._goal, self._path = grid, start, goal, path
        self._turns = 0
        self._done = False
        return self._render("Reach G."), {"height": HEIGHT, "width": WIDTH,
                                          "shortest_path": len(path)}

    def _render(self, msg):
        rows = []
        for r in range(HEIGHT):
            row = ""
            for c in range(WIDTH):
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
        trunc = (not term) and self._turns >= self.max_turns
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
        first = " ".join(self._path[: (len(self._path) + 1) // 2])
        return (f"A shortest path has {len(self._path)} moves; it begins with: {first}.")

    def solution(self):
        path = _bfs(self._grid, self._pos, self._goal) or []
        size = max(1, -(-len(path) // 10))
        return [" ".join(path[i:i + size]) for i in range(0, len(path), size)]
