// Live updates: each page polls the API while it is shown.

export const POLL_MS = 1500;

/** Call `tick` now and every `ms` while the page is shown; returns the stopper. A failed
 *  tick marks the header's live indicator instead of breaking the page. */
export function every(ms, tick) {
  let timer = null;
  let stopped = false;
  const live = document.getElementById("live");
  const run = async () => {
    try {
      await tick();
      live.classList.remove("stale");
      live.title = "Updates every 1.5 s";
    } catch (e) {
      live.classList.add("stale");
      live.title = `Last update failed: ${e.message}`;
    }
    if (!stopped) timer = setTimeout(run, ms);
  };
  run();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
