"""Multi-turn tool use on a shop API: fix a cart so it holds exactly the right product, check out."""

import json
import random

CATEGORIES = ["headphones", "chargers", "cables", "keyboards", "lamps"]
BRANDS = ["Acme", "Borealis", "Cobalt", "Dynamo", "Everest", "Flux", "Granite", "Helix", "Ion",
          "Juniper", "Krypton", "Lumen"]
TOOLS = [
    {"type": "function", "function": {
        "name": "list_products",
        "description": "List the products of a category with price, rating and stock.",
        "parameters": {"type": "object", "properties": {
            "category": {"type": "string", "enum": CATEGORIES}}, "required": ["category"]}}},
    {"type": "function", "function": {
        "name": "view_cart", "description": "Show the cart's contents.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
    {"type": "function", "function": {
        "name": "add_to_cart", "description": "Add units of a product to the cart.",
        "parameters": {"type": "object", "properties": {
            "product_id": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1}},
            "required": ["product_id", "quantity"]}}},
    {"type": "function", "function": {
        "name": "remove_from_cart", "description": "Remove every unit of a product from the cart.",
        "parameters": {"type": "object", "properties": {"product_id": {"type": "string"}},
                       "required": ["product_id"]}}},
    {"type": "function", "function": {
        "name": "checkout", "description": "Pay for the cart; this ends the episode.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
]


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


def _template(tool, **placeholders):
    """A call's JSON form with <placeholders> for its arguments, as a task may show it."""
    return json.dumps({"tool": tool, "arguments": {k: f"<{v}>" for k, v in placeholders.items()}})


def _call(tool, **arguments):
    return json.dumps({"tool": tool, "arguments": arguments})


def _parse_call(action):
    try:
        obj = json.loads(action)
    except Exception:
        return None, None
    if not isinstance(obj, dict) or not isinstance(obj.get("tool"), str):
        return None, None
    args = obj.get("arguments", {})
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except Exception:
            return obj["tool"], None
    return obj["tool"], args if isinstance(args, dict) else None


class Environment:
    name = "shop_inventory"
    description = (
        "Multi-turn tool use on a shop API. The cart already holds some items left over from "
        "an earlier session. Make the cart hold exactly the requested quantity of the cheapest "
        "product in the requested category whose rating is at least the requested minimum and "
        "whose stock covers the quantity, and nothing else; then check out. Tools: "
        "list_products(category), view_cart(), add_to_cart(product_id, quantity), "
        "remove_from_cart(product_id), checkout(). Each reply must be one JSON tool call "
        "exactly like {\"tool\": \"view_cart\", \"arguments\": {}}. Checking out ends the "
        "episode and pays 1 only if the cart is exactly right."
    )
    max_turns = 10
    tools = TOOLS

    params = {
        "products": {"type": "int", "min": 1, "max": 4, "default": 4,
                     "description": "products per category"},
        "trap": {"type": "bool", "default": True,
                 "description": "the cheapest product of the category fails the rating or the "
                                "stock"},
        "leftover": {"type": "int", "min": 0, "max": 2, "default": 2,
                     "description": "most unwanted items already in the cart (at least one "
                                    "unless 0)"},
        "qty_max": {"type": "int", "min": 1, "max": 5, "default": 5,
                    "description": "largest quantity asked (from 2 up, or exactly 1)"},
        "show_format": {"type": "bool", "default": False, "easy": True,
                        "description": "the task shows the JSON form of each call it needs, "
                                       "with <placeholders> to fill in"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        per = knobs["products"]
        trap = knobs["trap"] and per >= 2
        right = 1 if trap else 0  # the rank by price of the product to buy
        self._category = rng.choice(CATEGORIES)
        self._qty = rng.randint(min(2, knobs["qty_max"]), knobs["qty_max"])
        self._min_rating = rng.choice([3.5, 4.0, 4.2, 4.5])
        ids = rng.sample(range(100, 1000), 5 * per)
        cents = rng.sample(range(900, 9000, 10), 5 * per)
        self._products = {}
        for ci, cat in enumerate(CATEGORIES):
            brands = rng.sample(BRANDS, per)
            group = sorted(range(per), key=lambda j: cents[ci * per + j])
            for rank, j in enumerate(group):
                pid = f"P{ids[ci * per + j]}"
                rating = round(rng.uniform(3.0, 5.0), 1)
                stock = rng.randint(0, 12)
                if cat == self._category:
                    if rank < right:  # cheapest: fails the rating or the stock
                        if rng.random() < 0.5:
                            rating = round(self._min_rating - 0.3, 1)
                        else:
                            stock = rng.randint(0, self._qty - 1)
                    elif rank == right:  # the right one
                        rating = round(rng.uniform(self._min_rating, 5.0), 1)
                        stock = rng.randint(self._qty, 15)
                self._products[pid] = {"id": pid, "name": f"{brands[j]} {cat[:-1]}",
                                       "category": cat, "price": cents[ci * per + j] / 100,
                                       "rating": rating, "stock": stock}
        ok = [p for p in self._products.values() if p["category"] == self._category
              and p["rating"] >= self._min_rating and p["stock"] >= self._qty]
        self._target = min(ok, key=lambda p: p["price"])["id"]
        others = [pid for pid in self._products if pid != self._target
                  and self._products[pid]["stock"] > 0]
        self._cart = {}
        extra = rng.randint(min(1, knobs["leftover"]), knobs["leftover"])
        for pid in rng.sample(others, extra):
            self._cart[pid] = 1
        self._leftover = list(self._cart)
        self._turns = 0
        self._done = False
        units = "unit" if self._qty == 1 else "units"
        obs = (f"Task: buy exactly {self._qty} {units} of the cheapest {self._category[:-1]} "
               f"(category '{self._category}') rated at least {self._min_rating} that has enough "
               "stock, and nothing else. Reply with one JSON tool call per turn.")
        if knobs["show_format"]:
            calls = [_call("view_cart")] if self._leftover else []
            calls += [_template("remove_from_cart", product_id="id")] if self._leftover else []
            calls += [_call("list_products", category=self._category),
                      '{"tool": "add_to_cart", "arguments": {"product_id": "<id>", '
                      '"quantity": <number>}}',
                      _call("checkout")]
            obs += " The calls you need look like: " + " ".join(calls)
        return obs, {"category": self._category, "quantity": self._qty,
                     "min_rating": self._min_rating, "knobs": knobs}

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
            obs += " Out of turns; the episode is over without a checkout."
        return obs, float(reward), term, trunc, info

    def _cart_view(self):
        items = [{"product_id": pid, "name": self._products[pid]["name"], "quantity": q,
                  "price": self._products[pid]["price"]} for pid, q in self._cart.items()]
        total = sum(self._products[pid]["price"] * q for pid, q in self._cart.items())
        return json.dumps({"items": items, "total": round(total, 2)})

    def _act(self, action):
        tool, args = _parse_call(action)
        if tool is None:
            return ("Not a tool call. Reply with JSON like {\"tool\": \"view_cart\", "
                    "\"arguments\": {}}.", 0.0, False, {"error": "not_a_tool_call"})
        if args is None:
            return "The arguments must be a JSON object.", 0.0, False, {"error": "bad_arguments"}
        names = ("list_products", "view_cart", "add_to_cart", "remove_from_cart", "checkout")
        if tool not in names:
            return (f"Unknown tool {tool[:40]!r}; use {', '.join(names)}.", 0.0, False,
                    {"error": "unknown_tool"})
        if tool == "checkout":
            if self._cart == {self._target: self._qty}:
                return "Checked out: exactly the right items.", 1.0, True, {"success": True}
            return "Checked out, but the cart was not exactly what was asked.", 0.0, True, {
                "success": False}
        if tool == "view_cart":
            return self._cart_view(), 0.0, False, {"tool": tool}
        if tool == "list_products":
            cat = args.get("category")
            if cat not in CATEGORIES:
                return f"Unknown category; categories: {', '.join(CATEGORIES)}.", 0.0, False, {
                    "error": "bad_arguments"}
            rows = [p for p in self._products.values() if p["category"] == cat]
            return json.dumps({"category": cat, "products": rows}), 0.0, False, {"tool": tool}
        pid = args.get("product_id")
        pid = pid.strip().upper() if isinstance(pid, str) else None
        if pid not in self._products:
            return f"{tool}: no product with that id.", 0.0, False, {"error": "bad_arguments"}
        if tool == "remove_from_cart":
            if pid not in self._cart:
                return f"remove_from_cart: {pid} is not in the cart.", 0.0, False, {"tool": tool}
            del self._cart[pid]
            return self._cart_view(), 0.0, False, {"tool": tool}
        qty = args.get("quantity", 1)
        if isinstance(qty, float) and qty.is_integer():
            qty = int(qty)
        if isinstance(qty, bool) or not isinstance(qty, int) or qty < 1:
            return "add_to_cart needs a positive integer 'quantity'.", 0.0, False, {
                "error": "bad_arguments"}
        if self._cart.get(pid, 0) + qty > self._products[pid]["stock"]:
            return (f"add_to_cart: only {self._products[pid]['stock']} units of {pid} in "
                    "stock.", 0.0, False, {"tool": tool})
        self._cart[pid] = self._cart.get(pid, 0) + qty
        return self._cart_view(), 0.0, False, {"tool": tool}

    def hint(self):
        if not self._leftover:
            return f"The product to buy is {self._target}; the cart starts empty."
        return (f"The product to buy is {self._target}; the cart starts with "
                f"{', '.join(self._leftover)}, which must be removed.")

    def solution(self):
        moves = [_call("view_cart")]
        moves += [_call("remove_from_cart", product_id=pid) for pid in self._leftover]
        moves += [_call("list_products", category=self._category),
                  _call("add_to_cart", product_id=self._target, quantity=self._qty),
                  _call("checkout")]
        return moves
