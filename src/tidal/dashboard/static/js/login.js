// The login page: posts the token; the server answers with an HttpOnly cookie or 401.
const form = document.getElementById("login-form");
const error = document.getElementById("login-error");

// A one-time login link that was used already, has expired or is unknown lands here.
if (new URLSearchParams(location.search).get("link") === "refused") {
  error.textContent = "This login link was used already or has expired. "
    + "Make a new one with `tidal login-link`, or paste the token.";
  error.hidden = false;
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  error.hidden = true;
  const button = form.querySelector("button");
  button.disabled = true;
  try {
    const token = document.getElementById("token").value.trim();
    const response = await fetch("/login", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ token }),
      credentials: "same-origin",
    });
    if (response.ok) {
      location.href = "/";
      return;
    }
    error.textContent =
      response.status === 401 ? "Wrong token: the server refused it." : `Login failed (${response.status}).`;
  } catch (e) {
    error.textContent = `Cannot reach the server: ${e.message}`;
  } finally {
    error.hidden = error.textContent === "";
    button.disabled = false;
  }
});
