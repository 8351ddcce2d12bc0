// The URL fragment: a route ("#/machine/ID") and, for a link that signs in, "token=…" as one "&"-separated part,
// before or after the route. The token is taken out whole, with its separator, so the route is left as it was.

// { token, rest }: the token (decoded; null when there is none) and the fragment without it ("#/" when empty).
export function takeToken(hash) {
  const parts = hash.replace(/^#/, "").split("&");
  const found = parts.find((part) => part.startsWith("token=") && part.length > "token=".length);
  if (found === undefined) return { token: null, rest: hash };
  const others = parts.filter((part) => part !== found && part !== "");
  return { token: decoded(found.slice("token=".length)), rest: others.length ? `#${others.join("&")}` : "#/" };
}

function decoded(value) {
  try {
    return decodeURIComponent(value);
  } catch {
    return value; // a "%" that starts no escape: the token as it was pasted
  }
}
