"""A real browser for the UI tests: Debian's Chromium driven by Playwright.

The browser is ``/usr/bin/chromium`` from the ``chromium`` package (``scripts/ensure_browser.sh``
installs it, with ``chromium-driver``); Playwright never downloads one. A missing browser
is a test failure, not a skip: a skipped browser test would hide that CI cannot run it.

The helpers know the DOM of the Prefect 3.8.8 UI (its ``prefect-design`` components): a
schema form property is a ``div.schema-form-property`` whose header holds its label; an
enum is a ``p-select`` whose options open (from the keyboard) in a ``role=listbox`` popover.
Screenshots go to ``tests/e2e/screenshots/`` (git-ignored).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from prefect_e2e_processes import REPO

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# headless, no sandbox (we are root), and nothing that reaches for the network on its own:
# without the background-networking flags Chromium keeps trying hosts it cannot reach
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage"]
# wide enough that the deployment list shows every schedule tag instead of a "+1" overflow
VIEWPORT = {"width": 1920, "height": 1080}
SCREENSHOTS = REPO / "tests" / "e2e" / "screenshots"
UI_TIMEOUT_MS = 30_000
# XPath tests of the Prefect UI's schema form: a property is a div with the class token
# "schema-form-property" (its header's "schema-form-property__header" is another token);
# its title is the "schema-form-property__label" span in its own header
_IS_PROPERTY = "contains(concat(' ', normalize-space(@class), ' '), ' schema-form-property ')"
_IS_LABEL = "contains(concat(' ', normalize-space(@class), ' '), ' schema-form-property__label ')"


def require_chromium() -> None:
    """Fail (never skip) when Debian's Chromium is not installed."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        raise AssertionError(f"{', '.join(missing)} missing: the browser tests need Debian's chromium and "
                             "chromium-driver packages (run scripts/ensure_browser.sh as root)")


@contextmanager
def chromium_browser() -> Iterator[Any]:
    """A headless ``/usr/bin/chromium`` under Playwright (a fresh temporary profile), closed after."""
    require_chromium()
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # Playwright gives every launch its own temporary --user-data-dir
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def ui_page(browser: Any) -> Iterator[Any]:
    """A page in a fresh browser context (no state shared between tests)."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(UI_TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def screenshot(page: Any, name: str) -> Path:
    """Save the visible page as ``tests/e2e/screenshots/<name>.png``; return the path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def _titled(title: str) -> str:
    """XPath test: the context node's text is ``title`` or ``"<title> (Optional)"``."""
    if "'" in title:
        raise ValueError(f"a title with a quote cannot be matched: {title!r}")
    quoted = [f"'{t}'" for t in (title, f"{title} (Optional)")]
    return " or ".join(f"normalize-space(.)={q}" for q in quoted)


def schema_property(page: Any, *path: str) -> Any:
    """The schema form property at ``path`` of titles, e.g. ``("trainer",)`` or ``("params", "Rl")``.

    Titles match with or without the UI's `` (Optional)`` suffix. The property must sit at
    exactly that nesting: ``("trainer",)`` is the top-level ``trainer`` parameter (Prefect
    titles a flow parameter with its name), not a ``Trainer`` deeper down (``params.trainer``).
    """
    header_label = f"div[contains(@class, 'p-label__header')]//span[{_IS_LABEL}]"
    conditions = [f"count(ancestor::div[{_IS_PROPERTY}]) = {len(path)}"]
    for k, title in enumerate(reversed(path), start=1):
        conditions.append(f"ancestor::div[{_IS_PROPERTY}][{k}]/{header_label}[{_titled(title)}]")
    label = f"//span[{_IS_LABEL}][{' and '.join(conditions)}]"
    return page.locator(f"xpath={label}/ancestor::div[{_IS_PROPERTY}][1]")


def select_options(page: Any, prop: Any, screenshot_name: str | None = None) -> list[str]:
    """Open the select of ``prop`` (from the keyboard, as the mouse click of a headless
    page does not open it), return its option texts in order, close it again.

    ``screenshot_name``: also save a screenshot while the list is open.
    """
    from playwright.sync_api import expect

    control = prop.locator(".p-select-button__control")
    expect(control).to_have_count(1)
    control.scroll_into_view_if_needed()
    control.focus()
    page.keyboard.press("ArrowDown")
    listbox = page.get_by_role("listbox")
    expect(listbox).to_be_visible()
    options = listbox.get_by_role("option")
    expect(options.first).to_be_visible()
    texts = [t.strip() for t in options.all_inner_texts()]
    if screenshot_name:
        screenshot(page, screenshot_name)
    page.keyboard.press("Escape")
    expect(listbox).to_have_count(0)
    return texts


def schema_enum(schema: dict[str, Any], *path: str) -> list[str]:
    """The ``enum`` of the property at ``path`` of a deployment's parameter schema.

    Follows ``$ref`` (``#/definitions/...`` or ``#/$defs/...``), ``allOf`` and ``anyOf``
    (an ``Optional`` enum is ``anyOf: [{enum}, {type: null}]``).
    """
    definitions = {**schema.get("definitions", {}), **schema.get("$defs", {})}

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = definitions[node["$ref"].rsplit("/", 1)[-1]]
        return node

    def find_enum(node: dict[str, Any]) -> list[str] | None:
        node = resolve(node)
        if "enum" in node:
            return list(node["enum"])
        for key in ("allOf", "anyOf"):
            for sub in node.get(key, []):
                found = find_enum(sub)
                if found is not None:
                    return found
        return None

    def properties_of(node: dict[str, Any]) -> dict[str, Any]:
        node = resolve(node)
        props = dict(node.get("properties", {}))
        for key in ("allOf", "anyOf"):
            for sub in node.get(key, []):
                props.update(properties_of(sub))
        return props

    node = schema
    for name in path:
        props = properties_of(node)
        if name not in props:
            raise AssertionError(f"parameter schema has no property {'.'.join(path)} (at {name!r})")
        node = props[name]
    found = find_enum(node)
    if found is None:
        raise AssertionError(f"parameter schema property {'.'.join(path)} is not an enum: {resolve(node)}")
    return found
