/* Starts the vendored Swagger UI on /docs (app/routes/docs.py): no inline script, so the page keeps a CSP
   without 'unsafe-inline' for scripts. */
(function () {
  "use strict";
  var node = document.getElementById("swagger-ui");
  if (!node || !window.SwaggerUIBundle) return;
  window.ui = window.SwaggerUIBundle({
    url: node.getAttribute("data-openapi-url"),
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [window.SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
})();
