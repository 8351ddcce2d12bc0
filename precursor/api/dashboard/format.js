// How the dashboard writes figures: shares as whole percentages, the API's ISO times as epoch milliseconds, ages.

export const HOUR = 3600e3;

export function pct(v) {
  return v === null || v === undefined ? "–" : `${Math.round(v * 100)}%`;
}

export function ms(iso) {
  return iso ? Date.parse(iso) : null;
}

// How long before `reference` (now when not given) `iso` was: minutes under an hour, hours under two days, else days.
export function ago(iso, reference) {
  if (!iso) return "–";
  const diff = (reference ?? Date.now()) - Date.parse(iso);
  const hours = diff / HOUR;
  if (Math.abs(hours) < 1) return `${Math.max(0, Math.round(diff / 60e3))} min`;
  if (Math.abs(hours) < 48) return `${hours.toFixed(hours < 10 ? 1 : 0)} h`;
  return `${(hours / 24).toFixed(1)} d`;
}
