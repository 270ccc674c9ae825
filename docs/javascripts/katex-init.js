// Typeset the math that pymdownx.arithmatex (generic mode) leaves in the page as
// \( ... \) and \[ ... \], with the KaTeX copy served by this site. Material's
// instant navigation swaps page bodies, so render on every `document$` event.
function renderArithmatex(root) {
  root.querySelectorAll(".arithmatex").forEach((element) => {
    renderMathInElement(element, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  });
}

if (typeof document$ !== "undefined") {
  document$.subscribe(({ body }) => renderArithmatex(body));
} else {
  document.addEventListener("DOMContentLoaded", () => renderArithmatex(document.body));
}
